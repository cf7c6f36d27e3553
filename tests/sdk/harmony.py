"""gpt-oss's harmony format through the official SDKs, on the tiny harmony fixture
(tests/data/tiny/gpt-oss-harmony: random weights, gpt-oss's tokens and chat template):

- a forced tool call (tool_choice "required" and a named function, whole and streamed) comes
  back as `tool_calls` whose arguments are a JSON object valid against the tool's schema: the
  call grammar writes harmony's `<|channel|>commentary to=functions.NAME ...` syntax;
- an answer in harmony (openai/harmony docs/format.md's "Example output", scripted through the
  engine's test hook, as random weights would not write it) has its reasoning apart from its
  content in every dialect: OpenAI chat `reasoning_content` (whole and in deltas), Anthropic
  a `thinking` block (and `thinking_delta` events), Responses a `reasoning` item (and
  `response.reasoning_text.delta` events), Ollama `message.thinking`;
- a second turn that sends the first one back (its reasoning, its tool call, the call's
  result), as agents do, is answered in every dialect, and its reasoning reaches the
  template (the prompt is longer than the same history without it: gpt-oss's template
  renders a calling turn's `thinking` as its analysis);
- a Responses turn as Codex sends it (`store: false`, `reasoning.summary`, `include:
  ["reasoning.encrypted_content"]`) gets the reasoning as its summary (whole and as summary
  events) and sealed, and the next turn sending the item back with only its summary and
  token prompts exactly as with its text; another server's token is a 400 naming the field.

Run by tests/families_chat.rs: `python harmony.py <base_url> <model id>`. Prints one line per
check and exits non-zero if any failed.
"""
import json
import sys

import anthropic
import jsonschema
import ollama
import openai
from checks import check, finish

BASE, MODEL = sys.argv[1], sys.argv[2]
SCRIPT, SCRIPT_END = "__mlxbar_fault_script__", "__mlxbar_fault_script_end__"
REASONING = 'User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.'
ANSWER = "2 + 2 = 4."
# The model's tokens as the docs show them; <|return|> (a stop token) ends generation.
HARMONY = f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>"
QUESTION = f"What is 2 + 2? {SCRIPT}{HARMONY}{SCRIPT_END}"
ASK = [{"role": "user", "content": QUESTION}]
ROOM = 400
# A first turn that reasons, then calls get_weather (the call grammar takes it as scripted).
CALL_REASONING = "User wants the weather. Call get_weather."
CALL = f'<|channel|>analysis<|message|>{CALL_REASONING}<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{{"unit":"celsius","days":3}}<|call|>'
ASK_CALL = [{"role": "user", "content": f"Weather for three days? {SCRIPT}{CALL}{SCRIPT_END}"}]
RESULT = '{"sky": "clear"}'

oa = openai.OpenAI(base_url=f"{BASE}/v1", api_key="none", max_retries=0)
an = anthropic.Anthropic(base_url=BASE, api_key="none", max_retries=0)
ol = ollama.Client(host=BASE)

# Every argument bounded (an enum, an integer in 1-7), so random weights finish the call.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["unit", "days"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}


def valid_call(name, arguments):
    args = json.loads(arguments)
    assert isinstance(args, dict), arguments
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in [WEATHER, CLOCK]}[name]
    jsonschema.validate(args, schema)


@check
def a_forced_call_comes_back_as_tool_calls():
    ask = [{"role": "user", "content": "Weather in Paris for three days?"}]
    for choice, names in [("required", {"get_weather", "get_time"}), ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"})]:
        r = oa.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER, CLOCK], tool_choice=choice, max_tokens=ROOM, temperature=0)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, r
        call = c.message.tool_calls[0]
        assert call.id.startswith("call_") and call.function.name in names, call
        valid_call(call.function.name, call.function.arguments)
        # the same streamed: id and name first, then the arguments in pieces
        stream = oa.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER, CLOCK], tool_choice=choice, max_tokens=ROOM, temperature=0, stream=True)
        deltas = [d for ch in stream for d in (ch.choices[0].delta.tool_calls or [])]
        assert deltas[0].id and deltas[0].function.name == call.function.name, deltas
        assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments, deltas


@check
def openai_chat_carries_reasoning_content():
    r = oa.chat.completions.create(model=MODEL, messages=ASK, max_tokens=ROOM)
    m = r.choices[0].message
    assert m.content == ANSWER and m.reasoning_content == REASONING, m
    assert r.choices[0].finish_reason == "stop", r
    reasoning, content = "", ""
    for ch in oa.chat.completions.create(model=MODEL, messages=ASK, max_tokens=ROOM, stream=True):
        d = ch.choices[0].delta
        r_piece, c_piece = getattr(d, "reasoning_content", None) or "", d.content or ""
        assert not (r_piece and c_piece), d
        assert not (content and r_piece), "reasoning after the answer began"
        reasoning, content = reasoning + r_piece, content + c_piece
    assert (reasoning, content) == (REASONING, ANSWER), (reasoning, content)


@check
def anthropic_messages_carry_a_thinking_block():
    m = an.messages.create(model=MODEL, max_tokens=ROOM, messages=ASK)
    assert [b.type for b in m.content] == ["thinking", "text"], m
    assert m.content[0].thinking == REASONING and m.content[1].text == ANSWER, m
    assert m.stop_reason == "end_turn", m
    with an.messages.stream(model=MODEL, max_tokens=ROOM, messages=ASK) as s:
        kinds = [e.delta.type for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert kinds[0] == "thinking_delta" and kinds[-1] == "text_delta", kinds
    assert [b.type for b in final.content] == ["thinking", "text"], final
    assert final.content[0].thinking == REASONING and final.content[1].text == ANSWER, final


@check
def anthropic_adaptive_thinking_and_effort_reach_harmony():
    # Claude Code's thinking setting: adaptive (the model decides; this one reasons), with an
    # effort, which sets harmony's "Reasoning:" line as the other dialects' fields do.
    m = an.messages.create(model=MODEL, max_tokens=ROOM, messages=ASK, thinking={"type": "adaptive"}, output_config={"effort": "low"})
    assert [b.type for b in m.content] == ["thinking", "text"] and m.content[0].thinking == REASONING, m
    try:
        an.messages.create(model=MODEL, max_tokens=ROOM, messages=ASK, output_config={"effort": "extreme"})
        raise AssertionError("an unknown effort was accepted")
    except anthropic.BadRequestError as e:
        assert "output_config.effort" in str(e), e


@check
def responses_carry_a_reasoning_item():
    r = oa.responses.create(model=MODEL, input=QUESTION, max_output_tokens=ROOM)
    assert [o.type for o in r.output] == ["reasoning", "message"], r.output
    assert r.output[0].content[0].type == "reasoning_text" and r.output[0].content[0].text == REASONING, r.output[0]
    assert r.output_text == ANSWER, r
    events = list(oa.responses.create(model=MODEL, input=QUESTION, max_output_tokens=ROOM, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == REASONING, [e.type for e in events]
    done = events[-1]
    assert done.type == "response.completed" and [o.type for o in done.response.output] == ["reasoning", "message"], done
    assert done.response.output_text == ANSWER, done


@check
def ollama_carries_message_thinking():
    r = ol.chat(model=MODEL, messages=ASK, think="high", options={"num_predict": ROOM})
    assert r.message.thinking == REASONING and r.message.content == ANSWER, r
    thinking, content = "", ""
    for ch in ol.chat(model=MODEL, messages=ASK, think=True, options={"num_predict": ROOM}, stream=True):
        thinking += ch.message.thinking or ""
        content += ch.message.content or ""
    assert (thinking, content) == (REASONING, ANSWER), (thinking, content)
    g = ol.generate(model=MODEL, prompt=QUESTION, options={"num_predict": ROOM})
    assert g.thinking == REASONING and g.response == ANSWER, g


def without(history, drop):
    """The history with the reasoning `drop` takes out of each item."""
    return [drop(dict(m)) for m in history]


@check
def openai_chat_takes_its_reasoning_back():
    r = oa.chat.completions.create(model=MODEL, messages=ASK_CALL, tools=[WEATHER], max_tokens=ROOM)
    m = r.choices[0].message
    assert m.reasoning_content == CALL_REASONING and [c.function.name for c in m.tool_calls] == ["get_weather"], m
    sent = m.model_dump(exclude_none=True)
    history = ASK_CALL + [sent, {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": RESULT}]
    count = lambda h: oa.chat.completions.create(model=MODEL, messages=h, tools=[WEATHER], max_tokens=1).usage.prompt_tokens
    bare = without(history, lambda m: {k: v for k, v in m.items() if k != "reasoning_content"})
    assert count(history) > count(bare), (count(history), count(bare))


@check
def anthropic_takes_its_thinking_back():
    tool = {"name": "get_weather", "description": WEATHER["function"]["description"], "input_schema": WEATHER["function"]["parameters"]}
    m = an.messages.create(model=MODEL, max_tokens=ROOM, messages=ASK_CALL, tools=[tool])
    assert [b.type for b in m.content] == ["thinking", "tool_use"] and m.content[0].thinking == CALL_REASONING, m
    blocks = [b.model_dump(exclude_none=True) for b in m.content]
    history = ASK_CALL + [{"role": "assistant", "content": blocks}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": m.content[1].id, "content": RESULT}]}]
    count = lambda h: an.messages.count_tokens(model=MODEL, messages=h, tools=[tool]).input_tokens
    bare = without(history, lambda m: {**m, "content": [b for b in m["content"] if b["type"] != "thinking"]} if m["role"] == "assistant" else m)
    assert count(history) > count(bare), (count(history), count(bare))
    again = an.messages.create(model=MODEL, max_tokens=ROOM, messages=history, tools=[tool])
    assert again.usage.input_tokens + (again.usage.cache_read_input_tokens or 0) == count(history), again


@check
def responses_take_their_reasoning_item_back():
    tool = {"type": "function", **WEATHER["function"]}
    r = oa.responses.create(model=MODEL, input=ASK_CALL, tools=[tool], max_output_tokens=ROOM)
    assert [o.type for o in r.output] == ["reasoning", "function_call"], r.output
    call = r.output[1]
    history = ASK_CALL + [o.model_dump(exclude_none=True) for o in r.output] + [{"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]
    count = lambda h: oa.responses.create(model=MODEL, input=h, tools=[tool], max_output_tokens=16).usage.input_tokens
    bare = [i for i in history if i.get("type") != "reasoning"]
    assert count(history) > count(bare), (count(history), count(bare))


@check
def responses_as_codex_sends_them():
    # Codex's every turn: no stored state, an effort and a summary, the reasoning sealed in
    # `encrypted_content`; its next turn sends the item back with its summary and token only.
    tool = {"type": "function", **WEATHER["function"]}
    ask = dict(model=MODEL, tools=[tool], store=False, reasoning={"effort": "low", "summary": "auto"},
               include=["reasoning.encrypted_content"], max_output_tokens=ROOM)
    r = oa.responses.create(input=ASK_CALL, **ask)
    rs, call = r.output
    assert rs.type == "reasoning" and [p.text for p in rs.summary] == [CALL_REASONING], rs
    assert rs.encrypted_content and "weather" not in rs.encrypted_content, rs
    assert r.reasoning.summary == "auto" and r.reasoning.effort == "low", r.reasoning
    events = list(oa.responses.create(input=ASK_CALL, stream=True, **ask))
    summary = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    assert summary == CALL_REASONING, [e.type for e in events]
    assert events[-1].response.output[0].encrypted_content == rs.encrypted_content, events[-1]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}
    sent = {k: v for k, v in rs.model_dump(exclude_none=True).items() if k != "content"}
    count = lambda h: oa.responses.create(input=h, **{**ask, "max_output_tokens": 16}).usage.input_tokens
    whole = ASK_CALL + [o.model_dump(exclude_none=True) for o in r.output] + [result]
    sealed = ASK_CALL + [sent, call.model_dump(exclude_none=True), result]
    bare = ASK_CALL + [call.model_dump(exclude_none=True), result]
    assert count(sealed) == count(whole) > count(bare), (count(sealed), count(whole), count(bare))
    # Another server's token cannot be read: a 400 that names the field.
    try:
        oa.responses.create(input=ASK_CALL + [{**sent, "encrypted_content": "gAAAAABnot-ours"}, call.model_dump(exclude_none=True), result], **ask)
        raise AssertionError("another server's encrypted_content was accepted")
    except openai.BadRequestError as e:
        assert "encrypted_content" in str(e), e


@check
def ollama_takes_its_thinking_back():
    r = ol.chat(model=MODEL, messages=ASK_CALL, tools=[WEATHER], think=True, options={"num_predict": ROOM})
    assert r.message.thinking == CALL_REASONING and [c.function.name for c in r.message.tool_calls] == ["get_weather"], r
    history = ASK_CALL + [r.message, {"role": "tool", "content": RESULT, "tool_name": "get_weather"}]
    count = lambda h: ol.chat(model=MODEL, messages=h, tools=[WEATHER], think=True, options={"num_predict": 1}).prompt_eval_count
    bare = ASK_CALL + [{"role": "assistant", "content": r.message.content or "", "tool_calls": r.message.tool_calls}, history[-1]]
    assert count(history) > count(bare), (count(history), count(bare))


finish()
