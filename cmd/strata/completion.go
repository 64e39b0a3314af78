package main

import (
	"fmt"
	"strings"

	"github.com/cpuguy83/go-md2man/v2/md2man"
	"github.com/urfave/cli/v2"
)

// completeFlag is how a completion script asks strata for the words that
// may follow (urfave/cli's EnableBashCompletion).
const completeFlag = "--generate-bash-completion"

// completing reports whether args ask for completions: then they go to
// urfave/cli as typed, not rewritten (a half-typed flag is no plugin
// option, an unfinished command no error).
func completing(args []string) bool {
	return len(args) > 1 && args[len(args)-1] == completeFlag
}

// The scripts call `strata ... --generate-bash-completion` with the words
// before the cursor (and the word under it when it begins a flag); strata
// prints the commands or flags that may come next.
const bashCompletion = `# bash completion for strata: eval "$(strata completion bash)" in ~/.bashrc,
# or strata completion bash > /etc/bash_completion.d/strata
_strata_complete() {
    local cur=${COMP_WORDS[COMP_CWORD]}
    local words=("${COMP_WORDS[@]:0:COMP_CWORD}")
    [[ $cur == -* ]] && words+=("$cur")
    local IFS=$'\n'
    COMPREPLY=($(compgen -W "$("${words[0]}" "${words[@]:1}" ` + completeFlag + ` 2>/dev/null)" -- "$cur"))
}
complete -o default -F _strata_complete strata
`

const zshCompletion = `#compdef strata
# zsh completion for strata: eval "$(strata completion zsh)" in ~/.zshrc, or
# strata completion zsh > "${fpath[1]}/_strata"
_strata() {
    local -a words_before opts
    words_before=("${(@)words[1,CURRENT-1]}")
    [[ ${words[CURRENT]} == -* ]] && words_before+=("${words[CURRENT]}")
    opts=("${(@f)$(SHELL=zsh "${words_before[@]}" ` + completeFlag + ` 2>/dev/null)}")
    if (( ${#opts} )) && [[ -n ${opts[1]} ]]; then
        _describe 'strata' opts
    else
        _files
    fi
}
compdef _strata strata
`

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print the shell completion script for bash, zsh or fish (commands and flags)",
		ArgsUsage: "bash|zsh|fish",
		Action: func(c *cli.Context) error {
			shell, err := oneArg(c, "bash, zsh or fish")
			if err != nil {
				return err
			}
			var script string
			switch shell {
			case "bash":
				script = bashCompletion
			case "zsh":
				script = zshCompletion
			case "fish":
				if script, err = docApp(c.App).ToFishCompletion(); err != nil {
					return err
				}
			default:
				return usageError{fmt.Sprintf("completion %q: give bash, zsh or fish", shell)}
			}
			_, err = fmt.Fprint(c.App.Writer, script)
			return err
		},
	}
}

// manCommand prints strata's man page, made from the commands and flags
// (`make man` writes it to docs/strata.1). Hidden: the page is installed.
func manCommand() *cli.Command {
	return &cli.Command{
		Name:   "man",
		Usage:  "print the man page (roff) made from the commands and flags",
		Hidden: true,
		Action: func(c *cli.Context) error {
			page, err := manPage(c.App)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(c.App.Writer, page)
			return err
		},
	}
}

// docApp is app as its man page and fish completion describe it: without
// urfave/cli's help command, a package variable that running a command
// adds to that command's subcommands (to its own, once `strata help CMD`
// ran): urfave/cli's walk of them would not end, and what it writes would
// depend on what ran before in the process. strata's commands have no
// subcommands of their own.
func docApp(app *cli.App) *cli.App {
	doc := &cli.App{Name: app.Name, Usage: app.Usage, Flags: app.Flags}
	for _, c := range app.Commands {
		if c.Name != "help" {
			bare := *c
			bare.Subcommands = nil
			doc.Commands = append(doc.Commands, &bare)
		}
	}
	return doc
}

// manPage is urfave/cli's Markdown of the app, with the ENVIRONMENT and
// EXIT STATUS sections of `strata --help`, as a section 1 page.
func manPage(app *cli.App) (string, error) {
	md, err := docApp(app).ToMarkdown()
	if err != nil {
		return "", err
	}
	md = "% strata 1\n\n" + md + "\n# ENVIRONMENT\n\n```\n" + envHelp + "\n```\n\n# EXIT STATUS\n\n" +
		strings.ReplaceAll(exitHelp, "\n", " ") + "\n\n# SEE ALSO\n\n`strata help COMMAND` or `strata COMMAND --help` (with the plugins' options and examples), README.md\n"
	return string(md2man.Render([]byte(md))), nil
}
