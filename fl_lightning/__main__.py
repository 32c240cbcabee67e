from .cli.main import entrypoint

entrypoint()
