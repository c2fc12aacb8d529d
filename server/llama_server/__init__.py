"""llama-server's own routes: /tokenize, /detokenize, /apply-template, /props, /completion, /infill,
/rerank, /embeddings."""

from localrun.server.llama_server.routes import router

__all__ = ["router"]
