"""The `draftsmith COMMAND` modules: one file per command, named after it; each provides
`add_arguments(parser)` and `main(args) -> int`."""
