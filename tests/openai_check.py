"""Every answer of `loom serve` checked against the OpenAI API's shapes:
the JSON schemas in tests/openai_schemas/ (written from the field lists of
the OpenAI API reference: required fields, nullability, finish_reason
values). tests/serve_client.py sends its raw requests through check() and
gives the openai client a transport that checks each response (and each
streamed chunk) before the client sees it; report() then says how many
were checked and lists the first failures."""
import json, os

import jsonschema

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_schemas")
SCHEMAS = {n[:-5]: json.load(open(os.path.join(HERE, n))) for n in os.listdir(HERE) if n.endswith(".json")}
checked = {"objects": 0, "chunks": 0}
failures = []


def schema_for(path, status, chunk):
    """The schema name an answer to `path` with `status` must meet (None: not an API object)."""
    path = path.split("?")[0]
    if not path.startswith("/v1/"):
        return None
    if status != 200:
        return "error"
    if path == "/v1/completions":
        return "completion_chunk" if chunk else "completion"
    if path == "/v1/chat/completions":
        return "chat_completion_chunk" if chunk else "chat_completion"
    if path == "/v1/models":
        return "model_list"
    if path.startswith("/v1/models/"):
        return "model"
    return None


def _one(name, obj, where):
    try:
        jsonschema.validate(obj, SCHEMAS[name])
    except jsonschema.ValidationError as e:
        failures.append("%s (%s): %s at %s in %s" % (where, name, e.message, list(e.absolute_path), json.dumps(obj)[:300]))


def check(path, status, content_type, body):
    """Check one answer: a JSON body, or server-sent events (each data: line)."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if content_type and content_type.startswith("text/event-stream"):
        name = schema_for(path, status, True)
        for line in body.split("\n"):
            if line.startswith("data: ") and line != "data: [DONE]" and name:
                try:
                    obj = json.loads(line[6:])
                except ValueError:
                    failures.append("%s: a chunk that is not JSON: %r" % (path, line[:200]))
                    continue
                # an error after the stream began arrives as an event of its own
                _one("error" if "error" in obj else name, obj, path)
                checked["chunks"] += 1
        return
    name = schema_for(path, status, False)
    if not name or not body:
        return
    if not (content_type or "").startswith("application/json"):
        failures.append("%s: status %d answered as %r, not JSON: %r" % (path, status, content_type, body[:120]))
        return
    try:
        obj = json.loads(body)
    except ValueError:
        failures.append("%s: body is not JSON: %r" % (path, body[:200]))
        return
    _one(name, obj, path)
    checked["objects"] += 1


def transport():
    """An httpx transport for openai.OpenAI(http_client=...) that checks every answer."""
    import httpx2

    class Checking(httpx2.HTTPTransport):
        def handle_request(self, request):
            r = super().handle_request(request)
            data = r.read()
            check(request.url.path, r.status_code, r.headers.get("content-type"), data)
            headers = [(k, v) for k, v in r.headers.items() if k.lower() not in ("content-length", "transfer-encoding")]
            return httpx2.Response(r.status_code, headers=headers, content=data, request=request)

    return httpx2.Client(transport=Checking(), timeout=600)


def report(out):
    """One PASS/FAIL line: every answer checked met its schema."""
    n = checked["objects"] + checked["chunks"]
    out("serve_openai_schemas", not failures and n > 0,
        "%d of %d answers break the schemas: %s" % (len(failures), n, "; ".join(failures[:5])) if failures
        else "nothing checked")
    print("serve schemas: %d objects and %d chunks checked" % (checked["objects"], checked["chunks"]), flush=True)
