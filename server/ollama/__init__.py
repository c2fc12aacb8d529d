"""Ollama's wire family under ``/api``: generation (routes.py), the model routes (models.py) and new
registrations (create.py: copy, create), uploads (blobs.py), one ``router``."""

from fastapi import APIRouter

from localrun.server.ollama import blobs, create, models, routes

router = APIRouter()
router.include_router(routes.router)
router.include_router(models.router)
router.include_router(create.router)
router.include_router(blobs.router)

__all__ = ["router"]
