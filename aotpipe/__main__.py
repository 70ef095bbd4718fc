"""``python -m aotpipe``: the same command line as the ``aotpipe`` script."""

from aotpipe.cli import main

if __name__ == "__main__":
    main(prog_name="aotpipe")
