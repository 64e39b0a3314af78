// Package usage marks an error as the user's invocation: an invalid option
// value or combination, which the CLI reports with exit status 2 (as
// flag parsing errors are), whichever package found it.
package usage

import "fmt"

// Error is an invalid invocation.
type Error struct{ msg string }

func (e Error) Error() string { return e.msg }

// Errorf formats an invalid invocation's message.
func Errorf(format string, args ...any) error { return Error{fmt.Sprintf(format, args...)} }
