"""The web app at ``/``: a chat page and the machine's models, served from files inside the package.

Everything the browser loads is here, under ``static/`` (plain HTML, CSS and JavaScript modules written
for localrun: no framework, no build step, nothing fetched from another origin), so an air-gapped browser
gets the whole app from localrun. :func:`install_web` adds ``GET /`` (the page), ``GET /web/{name}`` (its
files) and ``GET /admin/models`` (the store's models with their fit, for the page's Models view).

The page and its files load without the API key (they hold nothing secret: the key is asked for in the
page and sent as a header on the API calls, which the key guard still checks). ``server.web = false``
leaves all of this out and ``/`` answers its plain liveness line again.
"""

from __future__ import annotations

from localrun.server.web.assets import WEB_PREFIX, is_web_asset
from localrun.server.web.routes import install_web

__all__ = ["WEB_PREFIX", "install_web", "is_web_asset"]
