"""The served OpenAPI schema: every endpoint, the attempt header, explicit request models."""

from __future__ import annotations

from .conftest import Gateway


def test_the_schema_lists_every_endpoint(local_gateway: Gateway):
    schema = local_gateway.http.get("/openapi.json").json()
    assert {(path, method) for path, item in schema["paths"].items() for method in item} == {
        ("/health", "get"),
        ("/v1/models", "get"),
        ("/v1/chat/completions", "post"),
        ("/v1/responses", "post"),
        ("/v1/messages", "post"),
        ("/v1/attempts", "post"),
        ("/v1/attempts/{capture_key}", "get"),
        ("/v1/attempts/{capture_key}/close", "post"),
        ("/v1/attempts/{capture_key}/result", "post"),
        ("/v1/attempts/{capture_key}/calls/{call_id}/reject", "post"),
        ("/v1/attempts/{capture_key}/measure", "post"),
    }


def test_model_calls_document_the_attempt_call_id_and_attempt_token_headers(local_gateway: Gateway):
    paths = local_gateway.http.get("/openapi.json").json()["paths"]
    for path in ("/v1/chat/completions", "/v1/responses"):
        headers = {p["name"] for p in paths[path]["post"]["parameters"] if p["in"] == "header"}
        assert headers == {"X-Grove-Capture-Key", "X-Grove-Call-Id", "X-Grove-Attempt-Token"}


def test_request_models_refuse_unknown_fields(local_gateway: Gateway):
    models = local_gateway.http.get("/openapi.json").json()["components"]["schemas"]
    for name in ("ChatCompletionRequest", "ResponsesRequest", "OpenAttemptRequest"):
        assert models[name]["additionalProperties"] is False


def test_refusals_are_documented_with_the_error_body(local_gateway: Gateway):
    paths = local_gateway.http.get("/openapi.json").json()["paths"]
    answers = paths["/v1/chat/completions"]["post"]["responses"]
    assert answers["409"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"
    }


def test_parameters_keep_their_order_path_first_then_headers(local_gateway: Gateway):
    paths = local_gateway.http.get("/openapi.json").json()["paths"]

    def names(path: str) -> list[str]:
        return [p["name"] for p in paths[path]["post"]["parameters"]]

    assert names("/v1/attempts/{capture_key}/calls/{call_id}/reject") == [
        "capture_key",
        "call_id",
        "X-Grove-Attempt-Token",
    ]
    assert names("/v1/chat/completions") == [
        "X-Grove-Capture-Key",
        "X-Grove-Call-Id",
        "X-Grove-Attempt-Token",
    ]
