#!/usr/bin/env python3
"""tests/data/harmony_template_reference.json: gpt-oss's chat template (the tiny harmony
fixture's chat_template.jinja) rendered by transformers' apply_chat_template (Python jinja2)
for conversations that reach every part of it mlxbar uses: tools (enums, optional, nested,
arrays, defaults), a system or developer message, reasoning_effort, an assistant turn with a
tool call in history (its analysis kept or dropped), tool results, earlier final answers.
tests/tokenizer.rs renders the same inputs with mlxbar's minijinja renderer on the fixture.

Usage:
  python make_harmony_template_reference.py FIXTURE_DIR OUT_JSON

The messages and tools are written in the shape mlxbar hands its templates (HF's: a call's
arguments as an object, `tool_calls` only on turns that have calls). The template prints
today's date; it is recorded as DATE, and the test puts its own date there too.
"""
import datetime
import importlib.metadata
import json
import sys

from transformers import AutoTokenizer

DATE = "@DATE@"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "default": 1},
                "hourly": {"type": "boolean"},
                "fields": {"type": "array", "items": {"type": "string"}},
                "where": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}, "required": ["lat"]},
            },
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now", "parameters": {"type": "object", "properties": {}}}}


def call(args, id_="call_1", name="get_weather"):
    return {"role": "assistant", "content": "", "tool_calls": [{"id": id_, "type": "function", "function": {"name": name, "arguments": args}}]}


CASES = [
    {"name": "plain", "messages": [{"role": "user", "content": "What is 2 + 2?"}]},
    {"name": "system_high_effort", "reasoning_effort": "high",
     "messages": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]},
    {"name": "developer_low_effort_tools", "reasoning_effort": "low", "tools": [WEATHER, CLOCK],
     "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Weather in Zürich?"}]},
    {"name": "tool_round_trip", "tools": [WEATHER],
     "messages": [{"role": "user", "content": "Weather in Paris?"}, call({"city": "Paris", "unit": "celsius"}),
                  {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}", "tool_call_id": "call_1"}]},
    {"name": "tool_call_with_analysis", "tools": [WEATHER, CLOCK], "reasoning_effort": "medium",
     "messages": [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Time?"},
                  {**call({}, name="get_time"), "content": "Need the clock."},
                  {"role": "tool", "content": "12:00", "tool_call_id": "call_1"}]},
    {"name": "earlier_final_drops_call_analysis", "tools": [WEATHER],
     "messages": [{"role": "user", "content": "Weather in Oslo?"}, {**call({"city": "Oslo"}), "content": "Look it up."},
                  {"role": "tool", "content": "snow", "tool_call_id": "call_1"},
                  {"role": "assistant", "content": "It snows in Oslo."}, {"role": "user", "content": "Thanks! And Rome?"}]},
]


def main(fixture: str, out: str) -> None:
    tok = AutoTokenizer.from_pretrained(fixture)
    today = datetime.date.today().strftime("%Y-%m-%d")
    cases = []
    for case in CASES:
        kwargs = {"reasoning_effort": case["reasoning_effort"]} if "reasoning_effort" in case else {}
        text = tok.apply_chat_template(case["messages"], tools=case.get("tools"), tokenize=False, add_generation_prompt=True, **kwargs)
        assert today in text, "the template prints today's date"
        cases.append({**case, "text": text.replace(today, DATE)})
    how = (
        "scripts/reference/make_harmony_template_reference.py: transformers "
        f"{importlib.metadata.version('transformers')} (jinja2 {importlib.metadata.version('jinja2')}) "
        "AutoTokenizer.apply_chat_template(messages, tools=..., reasoning_effort=..., add_generation_prompt=True) "
        "on tests/data/tiny/gpt-oss-harmony (chat_template.jinja = tests/data/templates/gpt-oss.jinja); "
        f"today's date replaced by {DATE}"
    )
    with open(out, "w") as f:
        json.dump({"how_made": how, "date": DATE, "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(cases)} renderings to {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
