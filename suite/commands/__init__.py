"""One module per `suite` subcommand: NAME, HELP, add_arguments(parser), run(args) -> exit status."""
