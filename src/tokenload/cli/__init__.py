"""The ``tokenload`` command line: thin argparse subcommands over the library."""
