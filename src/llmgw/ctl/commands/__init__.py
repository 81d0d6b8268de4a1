"""One module per group of ctl commands; each command is `(args, ctx) -> exit code`."""
