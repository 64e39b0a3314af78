package checkpoint

import (
	"fmt"
	"unicode/utf8"
)

// CheckName refuses a tensor name that is not valid UTF-8. A safetensors
// header is JSON, whose strings are Unicode: writing such a name would put
// U+FFFD in place of each invalid byte, silently renaming the tensor (two
// names could even become one). The error shows the bytes escaped.
func CheckName(name string) error {
	if utf8.ValidString(name) {
		return nil
	}
	at := 0
	for at < len(name) {
		r, size := utf8.DecodeRuneInString(name[at:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		at += size
	}
	return fmt.Errorf("tensor name %q is not valid UTF-8 (byte 0x%02x at offset %d): strata refuses it rather than rename it; rename the tensor in the checkpoint", name, name[at], at)
}

// checkSurrogates refuses a JSON header holding a \u escape of an unpaired
// UTF-16 surrogate: it stands for no character (safetensors' own reader
// refuses it), and fastjson would keep the six characters as they are,
// renaming the tensor.
func checkSurrogates(header []byte) error {
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(header) || header[i] != '\\' || header[i+1] != 'u' {
			return 0, false
		}
		var r rune
		for _, c := range header[i+2 : i+6] {
			switch {
			case '0' <= c && c <= '9':
				r = r<<4 | rune(c-'0')
			case 'a' <= c && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case 'A' <= c && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return r, true
	}
	for i := 0; i < len(header); i++ {
		if header[i] != '\\' {
			continue
		}
		r, ok := hex4(i)
		switch {
		case !ok:
			i++ // another escape: skip its character (\\ included)
			continue
		case 0xd800 <= r && r < 0xdc00:
			if lo, ok := hex4(i + 6); ok && 0xdc00 <= lo && lo < 0xe000 {
				i += 11
				continue
			}
		case r < 0xdc00 || r >= 0xe000:
			i += 5
			continue
		}
		return fmt.Errorf("the header holds %q at byte %d, an unpaired UTF-16 surrogate that stands for no character: a tensor name must be valid Unicode; rename the tensor in the checkpoint", header[i:i+6], i)
	}
	return nil
}
