"""`python -m arealite.server --model-path DIR --port P` (see arealite/server/cli.py)."""

from arealite.server.cli import main

if __name__ == "__main__":
    main()
