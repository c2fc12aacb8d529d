"""Ollama's wire family under ``/api``: generation (routes.py), the model routes (models.py) and new
registrations (create.py: copy, create), one ``router``."""

from fastapi import APIRouter

from localrun.server.ollama import create, models, routes

router = APIRouter()
router.include_router(routes.router)
router.include_router(models.router)
router.include_router(create.router)

__all__ = ["router"]
