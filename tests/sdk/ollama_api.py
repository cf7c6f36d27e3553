"""The official ollama Python library against a running mlxbar, unchanged but for its host:
chat and generate, whole and streamed (the greedy answer to QUESTION is ANSWER, as on the
OpenAI route); options (num_predict, stop, num_ctx as the window); list, show and ps
(expires_at follows keep_alive); format with a Pydantic model's JSON Schema and "json"; a
tool call the model makes (after one example turn), whole and streamed; a tool round trip
with tool_calls and a tool message; load and unload with an empty prompt; pull from the fake hub
with Ollama's progress lines; the Ollama port (ollama_port) serving /api/version; errors as
ResponseError with their statuses (404 unknown model, 400 num_ctx beyond the context, think,
unknown options, 501 for routes mlxbar does not have).

Run by tests/ollama_sdk.rs: `python ollama_api.py <base_url> <hub repo to pull>` with
OLLAMA_API_KEY, QUESTION and ANSWER in the environment. Prints one line per check and exits
non-zero if any failed.
"""
import json
import os
import sys
from datetime import datetime

import httpx
import jsonschema
import ollama
from checks import check, finish
from pydantic import BaseModel

BASE, PULLED = sys.argv[1], sys.argv[2]
KEY = os.environ["OLLAMA_API_KEY"]
QUESTION, ANSWER = os.environ["QUESTION"], os.environ["ANSWER"]
AUTH = {"Authorization": f"Bearer {KEY}"}
client = ollama.Client(host=BASE)
health = httpx.get(f"{BASE}/health", headers=AUTH).json()
ID = health["model"]["id"]
NAME = f"{ID}:latest"
ASK = [{"role": "user", "content": QUESTION}]


def openai_answer():
    body = {"model": ID, "messages": ASK, "temperature": 0}
    r = httpx.post(f"{BASE}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def final_counts(r):
    assert r.done and r.done_reason == "stop", r
    assert r.eval_count == 11 and r.prompt_eval_count > 0, r
    assert r.total_duration >= r.eval_duration > 0 and r.prompt_eval_duration >= 0 and r.load_duration > 0, r
    datetime.fromisoformat(r.created_at.replace("Z", "+00:00"))


@check
def chat_answers_as_the_openai_route_does():
    r = client.chat(model=NAME, messages=ASK, stream=False)
    assert r.message.role == "assistant" and r.message.content == ANSWER, r
    assert r.message.content == openai_answer(), r
    assert r.model == NAME, r
    final_counts(r)
    # The id without the tag names the same model.
    assert client.chat(model=ID, messages=ASK).message.content == ANSWER


@check
def chat_streams_pieces_and_a_final_object():
    chunks = list(client.chat(model=NAME, messages=ASK, stream=True))
    assert len(chunks) > 2, chunks
    assert "".join(c.message.content for c in chunks) == ANSWER, chunks
    assert all(not c.done for c in chunks[:-1]), chunks
    final_counts(chunks[-1])


@check
def generate_answers_whole_and_streamed():
    r = client.generate(model=NAME, prompt=QUESTION)
    assert r.response == ANSWER, r
    final_counts(r)
    chunks = list(client.generate(model=NAME, prompt=QUESTION, stream=True))
    assert "".join(c.response for c in chunks) == ANSWER and len(chunks) > 2, chunks
    final_counts(chunks[-1])
    pirate = client.generate(model=NAME, prompt="Who are you?", system="You are a pirate named Blackbeard.", options={"num_predict": 24})
    plain = client.generate(model=NAME, prompt="Who are you?", options={"num_predict": 24})
    assert pirate.response != plain.response, (pirate, plain)


@check
def options_num_predict_and_stop():
    r = client.chat(model=NAME, messages=ASK, options={"num_predict": 3, "temperature": 0, "top_k": 40, "seed": 1})
    assert r.done_reason == "length" and r.eval_count == 3 and ANSWER.startswith(r.message.content), r
    r = client.chat(model=NAME, messages=ASK, options={"stop": ["classic"]})
    assert r.message.content == "The answer to this ", r
    ctx = client.show(NAME).modelinfo
    context = next(v for k, v in ctx.items() if k.endswith(".context_length"))
    assert client.chat(model=NAME, messages=ASK, options={"num_ctx": context}).message.content == ANSWER
    # num_ctx is the window prompt and answer share: the answer ends at its edge.
    r = client.chat(model=NAME, messages=ASK, options={"num_ctx": 40})
    assert r.done_reason == "length" and r.prompt_eval_count + r.eval_count == 40 and ANSWER.startswith(r.message.content), r


@check
def list_names_the_models():
    models = client.list().models
    mine = [m for m in models if m.model == NAME]
    assert mine, models
    m = mine[0]
    assert m.size > 0 and len(m.digest) == 64 and m.modified_at is not None, m
    assert m.details.format in ("gguf", "mlx") and m.details.family and m.details.parameter_size and m.details.quantization_level, m


@check
def show_gives_details_info_and_capabilities():
    s = client.show(NAME)
    assert "completion" in s.capabilities, s
    assert s.modelinfo["general.architecture"] == s.details.family, s
    assert any(k.endswith(".context_length") and v > 0 for k, v in s.modelinfo.items()), s
    assert s.template and "FROM " in s.modelfile and "temperature" in s.parameters, s


@check
def ps_lists_the_loaded_model_and_follows_keep_alive():
    client.chat(model=NAME, messages=ASK, keep_alive="5m", options={"num_predict": 1})
    first = [m for m in client.ps().models if m.model == NAME]
    assert first and first[0].size > 0 and first[0].size_vram == 0, first
    assert first[0].context_length > 0, first
    client.chat(model=NAME, messages=ASK, keep_alive="1h", options={"num_predict": 1})
    second = [m for m in client.ps().models if m.model == NAME][0]
    assert (second.expires_at - first[0].expires_at).total_seconds() > 3000, (first, second)


class Pet(BaseModel):
    name: str
    kind: str
    age: int


@check
def format_a_pydantic_schema_and_json():
    r = client.chat(model=NAME, messages=[{"role": "user", "content": "Describe my pet: a four-year-old cat called Tom."}], format=Pet.model_json_schema(), options={"num_predict": 100})
    pet = Pet.model_validate_json(r.message.content)
    jsonschema.validate(json.loads(r.message.content), Pet.model_json_schema())
    assert isinstance(pet, Pet), r
    r = client.generate(model=NAME, prompt="Give me a JSON object about cats.", format="json", options={"num_predict": 60})
    if r.done_reason == "stop":
        assert isinstance(json.loads(r.response), dict), r


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
      city: The city's name
    """
    return "22 degrees and sunny"


def weather_call(city):
    return ollama.Message(role="assistant", content="", tool_calls=[ollama.Message.ToolCall(function=ollama.Message.ToolCall.Function(name="get_weather", arguments={"city": city}))])


@check
def tool_round_trip():
    # The call as a client sends it back (the library's Message with tool_calls), then the
    # tool's result, which the answer reads.
    ask = [{"role": "user", "content": "What is the weather in London?"}]
    call = weather_call("London")
    # What the 135M model then writes varies with the CPU's kernel path (near-tied greedy
    # words: on a Xeon it echoed both results, on an EPYC only the first), so the check is
    # that each result reached the prompt (its tokens counted) and changed the greedy answer.
    answers, prompt_tokens = [], []
    for result in ["rainy, 12 degrees", "snowy, minus 5 degrees and a strong wind from the north"]:
        r = client.chat(model=NAME, messages=ask + [call, {"role": "tool", "content": result, "tool_name": "get_weather"}], tools=[get_weather], options={"num_predict": 40})
        assert r.done and r.message.content, r
        answers.append(r.message.content)
        prompt_tokens.append(r.prompt_eval_count)
    assert prompt_tokens[1] > prompt_tokens[0] + 5, prompt_tokens
    assert answers[0] != answers[1], answers
    # Offered tools the model may leave uncalled: a plain answer, no calls.
    r = client.chat(model=NAME, messages=ask, tools=[get_weather], options={"num_predict": 8})
    assert r.message.tool_calls is None and r.message.content, r


@check
def the_model_calls_a_tool():
    # Ollama has no tool choice, and the default model (135M) asked outright answers in
    # words. One example turn (a question, then the assistant's call, as a client sends its
    # history back) makes its own greedy answer to the next question a call, which the
    # server parses into message.tool_calls, whole and streamed. (With the example's tool
    # result and answer in between, the model imitates the result instead.) After the round
    # trip: a prompt prefix this check leaves in the prefix cache would change the round
    # trip's near-tied greedy words (common::agreement).
    ask = [{"role": "user", "content": "What is the weather in Paris?"}, weather_call("Paris"), {"role": "user", "content": "What is the weather in London?"}]
    options = {"temperature": 0, "seed": 1, "num_predict": 60}
    r = client.chat(model=NAME, messages=ask, tools=[get_weather], options=options)
    assert r.done_reason == "stop" and not r.message.content and len(r.message.tool_calls or []) == 1, r
    call = r.message.tool_calls[0].function
    assert call.name == "get_weather" and dict(call.arguments) == {"city": "London"}, r
    chunks = list(client.chat(model=NAME, messages=ask, tools=[get_weather], options=options, stream=True))
    calls = [c.function for chunk in chunks for c in (chunk.message.tool_calls or [])]
    assert [(c.name, dict(c.arguments)) for c in calls] == [("get_weather", {"city": "London"})], chunks
    assert chunks[-1].done_reason == "stop", chunks


def status_of(fn):
    try:
        fn()
    except ollama.ResponseError as e:
        return e.status_code, e.error
    raise AssertionError("it was answered")


@check
def errors_carry_their_status():
    status, error = status_of(lambda: client.chat(model="nobody/nothing", messages=ASK))
    assert status == 404 and "nobody/nothing" in error, (status, error)
    status, error = status_of(lambda: client.chat(model=f"{ID}:7b", messages=ASK))
    assert status == 404, (status, error)
    status, error = status_of(lambda: client.chat(model=NAME, messages=ASK, options={"num_ctx": 10_000_000}))
    assert status == 400 and "num_ctx" in error, (status, error)
    status, error = status_of(lambda: client.chat(model=NAME, messages=ASK, think=True))
    assert status == 400 and "think" in error, (status, error)
    status, error = status_of(lambda: client.chat(model=NAME, messages=ASK, options={"mirostat": 2}))
    assert status == 400 and "options.mirostat" in error, (status, error)
    status, error = status_of(lambda: client.generate(model=NAME, prompt=QUESTION, raw=True))
    assert status == 400 and error.startswith("raw"), (status, error)
    status, error = status_of(lambda: client.delete(NAME))
    assert status == 501 and "/api/delete" in error, (status, error)
    status, error = status_of(lambda: client.embed(model=NAME, input="x"))
    assert status == 501, (status, error)
    status, error = status_of(lambda: ollama.Client(host=BASE, headers={"Authorization": "Bearer wrong"}).list())
    assert status == 401, (status, error)


@check
def pull_reports_ollamas_progress_lines():
    lines = list(client.pull(PULLED, stream=True))
    assert lines[0].status == "pulling manifest", lines
    assert any(l.status.startswith("downloading") and l.total and l.completed is not None and l.digest for l in lines), lines
    assert lines[-1].status == "success", lines
    assert client.pull(PULLED).status == "success"
    status, error = status_of(lambda: client.pull("not a repo"))
    assert status == 400, (status, error)


@check
def the_ollama_port_serves_the_same_api():
    port = health["ollama_port"]["listening"]
    other = ollama.Client(host=f"http://{port}")
    version = httpx.get(f"http://{port}/api/version", headers=AUTH).json()
    assert version["version"], version
    assert any(m.model == NAME for m in other.list().models)
    assert httpx.get(f"http://{port}/api/version").status_code == 401, "the same API key guards it"


@check
def an_empty_prompt_loads_and_keep_alive_zero_unloads():
    r = client.generate(model=NAME, keep_alive=0)
    assert r.done and r.done_reason == "unload", r
    assert not [m for m in client.ps().models if m.model == NAME]
    r = client.chat(model=NAME, messages=[])
    assert r.done and r.done_reason == "load", r
    assert [m for m in client.ps().models if m.model == NAME]


finish()
