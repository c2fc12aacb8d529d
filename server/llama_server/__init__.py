"""llama-server's own routes: /tokenize, /detokenize, /apply-template, /props, /completion, /infill,
/rerank, /embeddings, and the slot API (/slots)."""

from localrun.server.llama_server.routes import router
from localrun.server.llama_server.slots import router as slots_router

router.include_router(slots_router)

__all__ = ["router"]
