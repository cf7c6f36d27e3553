"""The SDK scripts' harness: `@check` runs a check at once and reports it (`ok` or `FAIL`
with the traceback), `finish()` prints the summary and exits non-zero if any failed."""
import sys
import traceback

failures = []


def check(fn):
    try:
        fn()
        print(f"ok   {fn.__name__}", flush=True)
    except Exception:  # noqa: BLE001 - report every failure, then exit non-zero
        failures.append(fn.__name__)
        print(f"FAIL {fn.__name__}\n{traceback.format_exc()}", flush=True)
    return fn


def finish():
    print(f"{len(failures)} failed: {failures}" if failures else "all passed")
    sys.exit(1 if failures else 0)
