"""Ollama's wire family under ``/api``: generation (routes.py) and the model routes (models.py), one ``router``."""

from fastapi import APIRouter

from localrun.server.ollama import models, routes

router = APIRouter()
router.include_router(routes.router)
router.include_router(models.router)

__all__ = ["router"]
