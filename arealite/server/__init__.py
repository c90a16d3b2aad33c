"""The built-in inference server: SGLang 0.5.23's native HTTP protocol on a transformers model.

    python -m arealite.server --model-path DIR [--host 127.0.0.1] [--port 30000] [--random-seed S]
    arealite.server.process.launch_server_process(DIR) -> ServerProcess  (tests, notebooks)

It implements docs/protocol.md §1-7 as SGLang 0.5.23 does, so a client that works against it
works against real servers; where it differs on purpose is docs/protocol.md §9.
"""
