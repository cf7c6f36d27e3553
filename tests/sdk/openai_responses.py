"""The official openai SDK's Responses API against a running mlxbar, unchanged but for its
base URL: responses.create (the greedy answer, the same as chat.completions gives),
responses.stream (deltas join to the final text, numbered events), a function tool round
trip (function_call, function_call_output, answer) with tool_choice "required" and a named
tool, whole and streamed, text.format through responses.parse with a Pydantic model,
include=["message.output_text.logprobs"], max_output_tokens cutting the answer
(status "incomplete"), the stateless refusals (previous_response_id, store) and the SDK's
own errors (a wrong key is an AuthenticationError), and response.failed when the engine fails mid-stream.

Run by tests/openai_responses.rs:
`python openai_responses.py <base_url> <question> <answer> <fault_marker> <api_key>`. Prints one line
per check and exits non-zero if any failed.
"""
import json
import sys

import jsonschema
import openai
from checks import check, finish
from openai import OpenAI
from pydantic import BaseModel

BASE, QUESTION, ANSWER, FAULT, KEY = sys.argv[1:6]
client = OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0)
MODEL = "default"


@check
def create_answers_as_chat_completions_does():
    r = client.responses.create(model=MODEL, input=QUESTION)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed", r
    assert r.output_text == ANSWER, r
    message = r.output[0]
    assert message.type == "message" and message.role == "assistant" and message.status == "completed", message
    assert message.content[0].type == "output_text" and message.content[0].annotations == [], message
    assert r.tools == [] and r.tool_choice == "auto" and r.parallel_tool_calls is True and r.temperature == 0, r
    assert r.usage.output_tokens == 11 and r.usage.output_tokens_details.reasoning_tokens == 0, r.usage
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, r.usage
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}])
    assert chat.choices[0].message.content == r.output_text, (chat, r)
    assert chat.usage.prompt_tokens == r.usage.input_tokens, (chat.usage, r.usage)
    # Asked again, the prompt is read from the prefix cache.
    again = client.responses.create(model=MODEL, input=QUESTION)
    assert again.output_text == ANSWER and again.usage.input_tokens_details.cached_tokens > 0, again.usage


@check
def instructions_are_a_system_message():
    ask = [{"role": "user", "content": "Who are you?"}]
    pirate = client.responses.create(model=MODEL, input=ask, instructions="You are a pirate named Blackbeard.", max_output_tokens=24)
    items = client.responses.create(
        model=MODEL,
        input=[{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a pirate named Blackbeard."}]}] + ask,
        max_output_tokens=24,
    )
    plain = client.responses.create(model=MODEL, input=ask, max_output_tokens=24)
    # One prompt both ways (the answers may part late: the second reads the first's prefix cache).
    assert pirate.usage.input_tokens == items.usage.input_tokens, (pirate.usage, items.usage)
    assert "Blackbeard" in pirate.output_text and "Blackbeard" in items.output_text, (pirate.output_text, items.output_text)
    assert "Blackbeard" not in plain.output_text, plain.output_text
    assert pirate.instructions == "You are a pirate named Blackbeard.", pirate


@check
def stream_deltas_join_to_the_final_text():
    with client.responses.stream(model=MODEL, input=QUESTION) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed", kinds
    for expected in ("response.output_item.added", "response.content_part.added", "response.output_text.done", "response.content_part.done", "response.output_item.done"):
        assert kinds.count(expected) == 1, (expected, kinds)
    assert [e.sequence_number for e in events] == list(range(len(events))), events
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == ANSWER, deltas
    assert final.output_text == ANSWER and final.status == "completed" and final.usage.output_tokens == 11, final


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "Get the local time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}}, "required": ["timezone"], "additionalProperties": False},
    "strict": True,
}
SCHEMAS = {t["name"]: t["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def calls_of(response, names):
    calls = [o for o in response.output if o.type == "function_call"]
    assert calls, response
    for c in calls:
        assert c.call_id.startswith("call_") and c.id.startswith("fc_") and c.name in names, c
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
    return calls


@check
def function_call_round_trip_with_required():
    r = client.responses.create(model=MODEL, input=ASK, tools=[WEATHER, TIME], tool_choice="required", max_output_tokens=200)
    calls = calls_of(r, {"get_weather", "get_time"})
    assert r.status == "completed" and r.tool_choice == "required", r
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "22 degrees and sunny"} for c in calls]
    second = client.responses.create(model=MODEL, input=ASK + r.output + outputs, tools=[WEATHER, TIME], max_output_tokens=48)
    assert second.output and second.status in ("completed", "incomplete"), second
    assert second.output_text or any(o.type == "function_call" for o in second.output), second


@check
def a_named_function_is_called_once():
    r = client.responses.create(
        model=MODEL, input=ASK, tools=[WEATHER, TIME], tool_choice={"type": "function", "name": "get_time"}, max_output_tokens=200
    )
    calls = calls_of(r, {"get_time"})
    assert len(calls) == 1, r
    assert r.tool_choice.type == "function" and r.tool_choice.name == "get_time", r.tool_choice


@check
def streamed_function_calls_are_assembled_by_the_sdk():
    with client.responses.stream(
        model=MODEL, input=ASK, tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=200
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    call = calls_of(final, {"get_weather"})[0]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == call.arguments and len(done) == 1 and done[0].arguments == call.arguments, (deltas, done, call)
    assert json.loads(call.arguments)["city"], call
    # parsed_arguments: the SDK parses a strict tool's arguments itself.
    assert final.output[0].parsed_arguments == json.loads(call.arguments), final.output[0]


class Pet(BaseModel):
    name: str
    kind: str
    age: int


@check
def parse_with_a_pydantic_model():
    r = client.responses.parse(model=MODEL, input="Describe my pet: a four-year-old cat called Tom.", text_format=Pet, max_output_tokens=100)
    assert isinstance(r.output_parsed, Pet), r
    assert r.text.format.type == "json_schema" and r.text.format.name == "Pet", r.text


@check
def json_object_format_starts_an_object():
    # The grammar holds the answer to an object; the 135M model may not close it in 40 tokens.
    r = client.responses.create(model=MODEL, input="Describe my pet, a cat called Tom.", text={"format": {"type": "json_object"}}, max_output_tokens=40)
    assert r.output_text.startswith("{") and r.text.format.type == "json_object", r


@check
def include_returns_logprobs():
    r = client.responses.create(model=MODEL, input=QUESTION, include=["message.output_text.logprobs"], top_logprobs=2)
    text = r.output[0].content[0]
    assert text.text == ANSWER and len(text.logprobs) == r.usage.output_tokens, text
    assert "".join(lp.token for lp in text.logprobs) == ANSWER, text.logprobs
    for lp in text.logprobs:
        assert lp.logprob <= 0 and len(lp.top_logprobs) == 2 and lp.top_logprobs[0].logprob >= lp.top_logprobs[1].logprob, lp
    plain = client.responses.create(model=MODEL, input=QUESTION)
    assert plain.output[0].content[0].logprobs is None, plain


@check
def max_output_tokens_makes_it_incomplete():
    r = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
    assert r.usage.output_tokens == 3 and ANSWER.startswith(r.output_text) and r.output_text, r
    with client.responses.stream(model=MODEL, input=QUESTION, max_output_tokens=3) as stream:
        last = list(stream)[-1]
    assert last.type == "response.incomplete" and last.response.incomplete_details.reason == "max_output_tokens", last


def bad_request(naming, **kwargs):
    try:
        client.responses.create(model=MODEL, input=QUESTION, **kwargs)
        raise AssertionError(f"{kwargs} was accepted")
    except openai.BadRequestError as e:
        assert naming in e.body["message"], e.body
        return e


@check
def stateless_refusals_are_bad_requests():
    e = bad_request("previous_response_id", previous_response_id="resp_123")
    assert e.body["param"] == "previous_response_id" and e.body["type"] == "invalid_request_error", e.body
    bad_request("store", store=True)
    bad_request("bogus", extra_body={"bogus": 1})
    bad_request("web_search", tools=[{"type": "web_search"}])
    bad_request("reasoning", reasoning={"effort": "high"})
    # store: false is what mlxbar does.
    assert client.responses.create(model=MODEL, input=QUESTION, store=False, max_output_tokens=2).store is False


@check
def an_unknown_model_is_not_found():
    try:
        client.responses.create(model="nobody/nothing", input=QUESTION)
        raise AssertionError("an unknown model was answered")
    except openai.NotFoundError as e:
        assert e.body["code"] == "model_not_found" and e.body["param"] == "model", e.body


@check
def a_wrong_key_is_an_authentication_error():
    wrong = OpenAI(base_url=BASE + "/v1", api_key="wrong", max_retries=0)
    try:
        wrong.responses.create(model=MODEL, input=QUESTION)
        raise AssertionError("a wrong key was let in")
    except openai.AuthenticationError as e:
        assert e.body["code"] == "invalid_api_key", e.body


@check
def an_engine_failure_mid_stream_is_response_failed():
    events = list(client.responses.create(model=MODEL, input=f"please {FAULT}", stream=True))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"], events
    last = events[-1]
    assert last.type == "response.failed" and last.response.status == "failed", last
    assert last.response.error.code == "server_error" and "injected" in last.response.error.message, last.response.error
    # The server goes on.
    assert client.responses.create(model=MODEL, input=QUESTION).output_text == ANSWER


finish()
