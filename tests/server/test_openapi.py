"""The OpenAPI document tells the truth: every route the app answers is in it with its methods,
each declared request body is the model the route's own ``parse_body`` call names, the
operation ids are unique, the field policy shows, and the document sits behind the key."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
from fastapi.routing import iter_route_contexts
from jsonschema import Draft202012Validator

from localrun.server.fields import parse_body
from localrun.server.ollama.schemas import ModelBody, PullBody
from localrun.server.openapi import FRAMEWORK_PATHS, doc_of, documented, openapi_path

#: Routes that are not part of any API: the plain-text root.
UNDOCUMENTED = {"/"}


@pytest.fixture
def served(app_client):
    """The app with every optional part on (the mirror) and its served document."""
    client = app_client(mirror=True)
    response = client.get("/openapi.json")
    assert response.status_code == 200, response.text
    return client.app, response.json()


def app_routes(app):
    """(path, methods, endpoint) of every route the app matches, included routers flattened."""
    for ctx in iter_route_contexts(app.routes):
        if ctx.path in FRAMEWORK_PATHS or ctx.path in UNDOCUMENTED:
            continue
        yield ctx.path, set(ctx.methods or ()), ctx.endpoint


def parsed_models(endpoint) -> list[tuple[str, bool]]:
    """(model name, lenient) of each ``parse_body(request, Model, ...)`` call in the endpoint's source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(endpoint)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "parse_body":
            assert len(node.args) >= 2 and isinstance(node.args[1], ast.Name), ast.dump(node)
            lenient = next((k.value.value for k in node.keywords if k.arg == "lenient"), True)
            found.append((node.args[1].id, lenient))
    return found


def body_mismatches(endpoint) -> list[str]:
    """What is wrong between the endpoint's mark and what it parses (empty when they agree)."""
    doc = doc_of(endpoint)
    name = getattr(endpoint, "__qualname__", repr(endpoint))
    if doc is None:
        return [f"{name} has no documented(...) mark"]
    calls = parsed_models(endpoint)
    problems = []
    if doc.body is None:
        if calls:
            problems.append(f"{name} parses {calls[0][0]} but declares no body")
        return problems
    if not calls:
        return [f"{name} declares {doc.body.__name__} but parses no body"]
    for model_name, lenient in calls:
        model = endpoint.__globals__.get(model_name)
        if model is not doc.body:
            problems.append(f"{name} parses {model_name} but declares {doc.body.__name__}")
        if lenient == doc.strict:
            problems.append(f"{name}: parse_body lenient={lenient} but documented strict={doc.strict}")
    return problems


def test_every_route_is_in_the_document_with_its_methods(served):
    app, document = served
    missing = []
    count = 0
    for path, methods, _ in app_routes(app):
        entry = document["paths"].get(openapi_path(path), {})
        for method in methods:
            count += 1
            if method.lower() not in entry:
                missing.append(f"{method} {path}")
    assert not missing, missing
    # The families that were absent from FastAPI's own document: the bare aliases and the mirror.
    for path in ("/chat/completions", "/completions", "/models", "/api/models", "/{ns}/{name}/resolve/{rest}"):
        assert path in document["paths"], path
    assert count == sum(len(ops) for ops in document["paths"].values())


def test_every_declared_body_is_what_the_route_parses(served):
    app, document = served
    problems = []
    with_body = 0
    for path, _, endpoint in app_routes(app):
        problems += [f"{path}: {p}" for p in body_mismatches(endpoint)]
        with_body += doc_of(endpoint) is not None and doc_of(endpoint).body is not None
    assert not problems, problems
    assert with_body >= 25  # every POST route names one


def test_the_check_catches_a_planted_mismatch():
    @documented(ModelBody)
    async def wrong_model(request):
        return await parse_body(request, PullBody)

    @documented(ModelBody, strict=True)
    async def wrong_policy(request):
        return await parse_body(request, ModelBody)

    @documented()
    async def undeclared(request):
        return await parse_body(request, ModelBody)

    async def unmarked(request):
        return None

    @documented(ModelBody)
    async def right(request):
        return await parse_body(request, ModelBody)

    assert body_mismatches(wrong_model) == [f"{wrong_model.__qualname__} parses PullBody but declares ModelBody"]
    assert "lenient=True" in body_mismatches(wrong_policy)[0]
    assert "declares no body" in body_mismatches(undeclared)[0]
    assert "no documented" in body_mismatches(unmarked)[0]
    assert body_mismatches(right) == []


def test_request_bodies_and_answers_are_described(served):
    _, document = served
    ops = document["paths"]
    chat = ops["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionRequest"
    }
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert set(ops["/api/chat"]["post"]["responses"]["200"]["content"]) == {"application/json", "application/x-ndjson"}
    for path, entry in ops.items():
        for method, op in entry.items():
            if method in ("post", "put", "patch"):
                assert "requestBody" in op, f"{method} {path}"
            if "201" in op["responses"]:  # an upload: stored, with no body
                assert "200" not in op["responses"] and path == "/api/blobs/{ref}"
            elif method != "head" and path not in ("/api/delete", "/api/copy"):  # Ollama answers these with no body
                assert op["responses"]["200"].get("content"), f"{method} {path} declares no success body"

    # Errors come in each family's shape, as server/errors.py picks it by path.
    def error_ref(path, method="post"):
        return ops[path][method]["responses"]["default"]["content"]["application/json"]["schema"]["$ref"].rsplit("/")[
            -1
        ]

    assert error_ref("/v1/chat/completions") == "OpenAIError"
    assert error_ref("/api/chat") == "OllamaError"
    assert error_ref("/v1/messages") == "AnthropicError"
    assert error_ref("/{ns}/{name}/resolve/{rest}", "get") == "HubError"
    # The bare alias documents the same models as its /v1 route.
    assert ops["/chat/completions"]["post"]["requestBody"] == chat["requestBody"]


def test_operation_ids_are_unique(served):
    _, document = served
    ids = [op["operationId"] for entry in document["paths"].values() for op in entry.values()]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    # /rerank and /v1/rerank share one function: the id FastAPI would have given both.
    assert {"post_rerank", "post_v1_rerank"} <= set(ids)


def test_schemas_are_valid_and_every_ref_resolves(served):
    _, document = served
    schemas = document["components"]["schemas"]
    for name, schema in schemas.items():
        Draft202012Validator.check_schema(schema)
        assert "__" not in name, name  # pydantic's module-path names are shortened
    text = str(document)
    import re

    refs = set(re.findall(r"#/components/schemas/([A-Za-z0-9_]+)", text))
    assert refs <= set(schemas), refs - set(schemas)


def test_the_top_level_is_lenient_and_nested_levels_strict(served):
    _, document = served
    schemas = document["components"]["schemas"]
    assert "additionalProperties" not in schemas["ChatCompletionRequest"]  # unknown top-level names are ignored
    assert schemas["OpenaiChatMessage"]["additionalProperties"] is False  # a typo in a message is a 400
    assert schemas["LoadBody"]["additionalProperties"] is False  # the admin routes parse strictly


def test_strict_fields_shows_in_the_document(app_client):
    document = app_client(strict_fields=True).get("/openapi.json").json()
    assert document["components"]["schemas"]["ChatCompletionRequest"]["additionalProperties"] is False


def test_the_document_needs_the_key_when_one_is_set(app_client):
    client = app_client(api_key="s3cret-key")
    assert client.get("/openapi.json").status_code == 401
    assert client.get("/openapi.json", headers={"Authorization": "Bearer s3cret-key"}).status_code == 200


def test_docs_are_off_by_default_and_on_with_the_setting(app_client):
    assert app_client().get("/docs").status_code == 404
    page = app_client(docs=True).get("/docs")
    assert page.status_code == 200
    assert "/openapi.json" in page.text


@pytest.mark.parametrize(
    "method,path,allowed",
    [
        ("PUT", "/v1/chat/completions", {"POST"}),
        ("GET", "/api/delete", {"DELETE"}),
        ("POST", "/api/tags", {"GET", "HEAD"}),
        ("PATCH", "/v1/models", {"GET", "HEAD"}),
    ],
)
def test_every_405_says_what_is_allowed(served, method, path, allowed):
    """RFC 9110 §15.5.6: a 405 carries Allow. Before: none did."""
    from starlette.testclient import TestClient

    app, document = served
    r = TestClient(app, base_url="http://localhost").request(method, path)
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) >= allowed, (r.status_code, r.headers)
    documented = {m.upper() for m in document["paths"][path]}
    assert documented <= set(r.headers["allow"].split(", ")), (documented, r.headers["allow"])


@pytest.mark.parametrize("path", ["/api/show", "/api/delete", "/api/pull", "/api/create"])
def test_model_or_name_is_documented_as_required_where_it_is(served, path):
    """Before: these bodies documented no required field, yet each refuses a body without ``model``."""
    _, document = served
    method = next(iter(document["paths"][path]))
    schema = _body_schema(document, path, method)
    source = {"from": "tiny"} if path == "/api/create" else {}
    assert Draft202012Validator(schema).is_valid({"model": "tiny", **source})
    assert not Draft202012Validator(schema).is_valid(source)


def _body_schema(document, path, method="post"):
    operation = document["paths"][path][method]
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    return {**document["components"]["schemas"][ref], "components": document["components"]}


@pytest.mark.parametrize(
    "path,body,valid",
    [
        ("/api/show", {"name": None}, False),  # before: null satisfied "required"
        ("/api/show", {"name": "tiny"}, True),
        ("/api/create", {"model": "x"}, False),  # before: documented valid; the route wants from or files
        ("/api/create", {"model": "x", "from": "tiny"}, True),
        ("/rerank", {"query": "q"}, False),  # before: documented valid; the route wants documents or texts
        ("/rerank", {"query": "q", "documents": []}, False),
        ("/rerank", {"query": "q", "documents": ["a"], "texts": ["b"]}, False),
        ("/rerank", {"query": "q", "texts": ["b"]}, True),
        ("/api/generate", {"model": "tiny", "keep_alive": "5 minutes"}, False),  # before: any string
        ("/api/generate", {"model": "tiny", "keep_alive": "1h30m"}, True),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "function", "content": "x"}]}, False),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "function", "name": "f"}]}, True),
        # /v1/completions' empty prompt (refused unless a suffix asks for fill-in-the-middle) is said in
        # the field's description: as a conditional schema, schemathesis could generate no body at all
        ("/v1/completions", {"model": "tiny", "prompt": "", "suffix": "x"}, True),  # fill-in-the-middle
        ("/completion", {"prompt": ""}, False),
        ("/completion", {"prompt": "hi"}, True),
    ],
)
def test_documented_bounds_are_the_enforced_ones(served, path, body, valid):
    _, document = served
    assert Draft202012Validator(_body_schema(document, path)).is_valid(body) is valid, (path, body)


def test_the_slot_action_is_documented_as_the_three_it_takes(served):
    _, document = served
    path = next(p for p in document["paths"] if p.startswith("/slots/{"))
    action = next(q for q in document["paths"][path]["post"]["parameters"] if q["name"] == "action")
    assert action["required"] and action["schema"]["enum"] == ["save", "restore", "erase"]


@pytest.mark.parametrize("prefix", ["/v1/responses", "/responses"])
def test_a_created_response_links_to_its_get_and_delete(served, prefix):
    """Links let stateful testing chain create → get → delete (before: no links at all)."""
    _, document = served
    links = document["paths"][prefix]["post"]["responses"]["200"]["links"]
    item = document["paths"][f"{prefix}/{{rid}}"]
    targets = {item["get"]["operationId"], item["delete"]["operationId"]}
    assert {link["operationId"] for link in links.values()} == targets
    assert all(link["parameters"] == {"rid": "$response.body#/id"} for link in links.values())


def test_the_number_of_choices_is_documented_as_the_server_allows(app_client):
    """``n`` and ``best_of`` carry ``server.max_choices`` as their maximum (the routes refuse more), not 128."""
    document = app_client(max_choices=3).get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    found = []
    for schema in schemas.values():
        for name in ("n", "best_of"):
            prop = (schema.get("properties") or {}).get(name)
            if prop:
                found += [b["maximum"] for b in [prop, *prop.get("anyOf", ())] if "maximum" in b]
    assert found and set(found) == {3}, found
