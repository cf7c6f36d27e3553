"""The official anthropic SDK against a running mlxbar, unchanged but for its base URL:
messages.create plain, with a system prompt and stop_sequences; messages.stream with its
text stream and get_final_message(); a tool round trip (tool_use, then tool_result, then an
answer) with tool_choice "any" and a named tool; structured output through output_config
(a JSON Schema, and messages.parse with a Pydantic model); count_tokens against the same
request's usage; the SDK's own errors for an unknown model and a bad field; x-api-key.

Run by tests/anthropic_sdk.rs: `python anthropic_messages.py <base_url> <api_key>`. Prints one
line per check and exits non-zero if any failed.
"""
import json
import sys

import anthropic
import jsonschema
from checks import check, finish
from pydantic import BaseModel

client = anthropic.Anthropic(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
MODEL = "default"
QUESTION = "What is 2+2?"
ANSWER = "The answer to this classic math problem is 4."


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


@check
def create_answers_as_a_message():
    m = client.messages.create(model=MODEL, max_tokens=32, messages=[{"role": "user", "content": QUESTION}])
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), m
    assert text_of(m) == ANSWER, m
    assert m.stop_reason == "end_turn" and m.stop_sequence is None, m
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == 37, m.usage
    assert m.usage.output_tokens == 11, m.usage


@check
def max_tokens_and_stop_sequences():
    m = client.messages.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": QUESTION}])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3, m
    assert ANSWER.startswith(text_of(m)), m
    m = client.messages.create(
        model=MODEL, max_tokens=32, stop_sequences=["classic", "math"], messages=[{"role": "user", "content": QUESTION}]
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "classic", m
    assert text_of(m) == "The answer to this ", m


@check
def a_system_prompt_reaches_the_model():
    ask = [{"role": "user", "content": "Who are you?"}]
    plain = client.messages.create(model=MODEL, max_tokens=24, messages=ask)
    pirate = client.messages.create(
        model=MODEL, max_tokens=24, messages=ask, system=[{"type": "text", "text": "You are a pirate named Blackbeard.", "cache_control": {"type": "ephemeral"}}]
    )
    assert text_of(plain) != text_of(pirate), (text_of(plain), text_of(pirate))


@check
def stream_text_and_final_message():
    with client.messages.stream(model=MODEL, max_tokens=32, messages=[{"role": "user", "content": QUESTION}]) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == ANSWER, pieces
    assert text_of(final) == ANSWER and final.stop_reason == "end_turn", final
    assert final.usage.output_tokens == 11, final.usage


WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
TIME = {
    "name": "get_time",
    "description": "Get the local time in a timezone",
    "input_schema": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}}, "required": ["timezone"], "additionalProperties": False},
}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def tool_uses(message, schemas):
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses, message
    for u in uses:
        assert u.id.startswith("toolu_") and u.name in schemas, u
        jsonschema.validate(u.input, schemas[u.name])
    return uses


@check
def tool_round_trip_with_any():
    m = client.messages.create(model=MODEL, max_tokens=200, messages=ASK, tools=[WEATHER, TIME], tool_choice={"type": "any"})
    assert m.stop_reason == "tool_use", m
    uses = tool_uses(m, {"get_weather": WEATHER["input_schema"], "get_time": TIME["input_schema"]})
    results = [{"type": "tool_result", "tool_use_id": u.id, "content": "22 degrees and sunny"} for u in uses]
    second = client.messages.create(
        model=MODEL,
        max_tokens=48,
        messages=ASK + [{"role": "assistant", "content": m.content}, {"role": "user", "content": results}],
        tools=[WEATHER, TIME],
    )
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use"), second
    assert second.content, second


@check
def a_named_tool_is_called_once():
    m = client.messages.create(
        model=MODEL, max_tokens=200, messages=ASK, tools=[WEATHER, TIME], tool_choice={"type": "tool", "name": "get_time"}
    )
    uses = tool_uses(m, {"get_time": TIME["input_schema"]})
    assert len(uses) == 1 and uses[0].name == "get_time" and m.stop_reason == "tool_use", m


@check
def a_tool_result_marked_as_an_error_is_accepted():
    m = client.messages.create(model=MODEL, max_tokens=200, messages=ASK, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    use = tool_uses(m, {"get_weather": WEATHER["input_schema"]})[0]
    err = {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "service down"}], "is_error": True}
    again = client.messages.create(
        model=MODEL, max_tokens=16, messages=ASK + [{"role": "assistant", "content": m.content}, {"role": "user", "content": [err]}]
    )
    assert again.content and again.stop_reason in ("end_turn", "max_tokens"), again


@check
def streamed_tool_use_is_assembled_by_the_sdk():
    with client.messages.stream(
        model=MODEL, max_tokens=200, messages=ASK, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}
    ) as stream:
        final = stream.get_final_message()
    use = tool_uses(final, {"get_weather": WEATHER["input_schema"]})[0]
    assert use.input["city"], use


PET = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "kind": {"enum": ["cat", "dog", "bird"]}, "age": {"type": "integer", "minimum": 0, "maximum": 30}},
    "required": ["name", "kind", "age"],
    "additionalProperties": False,
}


@check
def output_config_json_schema_is_valid_json():
    m = client.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=[{"role": "user", "content": "Describe my pet: a four-year-old cat called Tom."}],
        output_config={"format": {"type": "json_schema", "schema": PET}},
    )
    jsonschema.validate(json.loads(text_of(m)), PET)


class Pet(BaseModel):
    name: str
    kind: str
    age: int


@check
def parse_with_a_pydantic_model():
    m = client.messages.parse(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "Describe my pet: a four-year-old cat called Tom."}], output_format=Pet
    )
    assert isinstance(m.parsed_output, Pet), m


@check
def count_tokens_equals_the_requests_input():
    ask = [{"role": "user", "content": "Count me, with tools."}]
    counted = client.messages.count_tokens(model=MODEL, messages=ask, tools=[WEATHER], system="Be brief.")
    m = client.messages.create(model=MODEL, max_tokens=1, messages=ask, tools=[WEATHER], system="Be brief.")
    assert counted.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), (counted, m.usage)
    plain = client.messages.count_tokens(model=MODEL, messages=ask)
    assert plain.input_tokens < counted.input_tokens, (plain, counted)


@check
def errors_are_the_sdks_own():
    try:
        client.messages.create(model="nobody/nothing", max_tokens=8, messages=ASK)
        raise AssertionError("an unknown model was answered")
    except anthropic.NotFoundError as e:
        assert e.body["type"] == "error" and e.body["error"]["type"] == "not_found_error", e.body
    try:
        client.messages.create(model=MODEL, max_tokens=8, messages=ASK, extra_body={"bogus": 1})
        raise AssertionError("an unknown field was accepted")
    except anthropic.BadRequestError as e:
        assert "bogus" in e.body["error"]["message"], e.body
    try:
        client.messages.create(model=MODEL, max_tokens=8, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024})
        raise AssertionError("thinking was accepted")
    except anthropic.BadRequestError as e:
        assert "thinking" in e.body["error"]["message"], e.body


@check
def a_wrong_key_is_an_authentication_error():
    wrong = anthropic.Anthropic(base_url=sys.argv[1], api_key="wrong", max_retries=0)
    try:
        wrong.messages.create(model=MODEL, max_tokens=8, messages=ASK)
        raise AssertionError("a wrong key was let in")
    except anthropic.AuthenticationError as e:
        assert e.body["error"]["type"] == "authentication_error", e.body


finish()
