"""Chat and completions sampling parameters beyond the token counts, checked as vLLM's
SamplingParams checks them: `n`, `stop`, and the bounds of temperature, top_p, top_k
and the penalties (the sim samples no differently for them, but refuses what vLLM does).

`n` choices are n sequences in the engine, as in vLLM (which fans a request out into n
child requests sharing the prompt): each costs its own decode steps and KV blocks, and
its prompt is prefilled again unless the prefix cache has it. vLLM gives child `k` the
seed `seed + k`; so does the sim, so choice 0 is the answer of `n = 1` and the others
differ. `best_of` is not read: vLLM (0.12 on) has no such field and ignores it.
"""

from __future__ import annotations

import math

from llmgw.simengine.errors import SimApiError

# vLLM's VLLM_MAX_N_SEQUENCES default.
MAX_N = 16384
# The sim's bound on one request's choices (prompts × n): each is a request in the
# engine, so n = 16384 over a batch of 2048 prompts would be 33 million (vLLM sets none).
MAX_CHOICES = 2048
# The sim's bounds on stop strings (vLLM sets none): each generated token is searched
# for each of them, and a stream holds back the longest's length.
MAX_STOPS = 128
MAX_STOP_CHARS = 4096
# Below this temperature vLLM samples greedily, and n > 1 is refused.
_GREEDY_BELOW = 1e-5


def choices_n(n: int | None, temperature: float | None, prompts: int = 1) -> int:
    """The request's `n` (choices per prompt), or vLLM's refusal of it."""
    n = 1 if n is None else n
    if n < 1:
        raise SimApiError(400, f"n must be at least 1, got {n}.", param="n")
    if n > MAX_N:
        raise SimApiError(
            400,
            f"n must be at most {MAX_N}, got {n}. To increase this limit, set the "
            "VLLM_MAX_N_SEQUENCES environment variable.",
            param="n",
        )
    if n > 1 and temperature is not None and temperature < _GREEDY_BELOW:
        raise SimApiError(400, f"n must be 1 when using greedy sampling, got {n}.", param="n")
    if n * prompts > MAX_CHOICES:
        raise SimApiError(
            400,
            f"the request asks for {n * prompts} choices (prompts × n); at most {MAX_CHOICES}",
            param="n",
        )
    return n


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """The request's stop strings, in its order, or vLLM's refusal of them (stops.py)."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if any(not s for s in stops):
        raise SimApiError(400, "stop cannot contain an empty string.", param="stop")
    if len(stops) > MAX_STOPS:
        raise SimApiError(
            400, f"stop holds {len(stops)} strings; at most {MAX_STOPS}", param="stop"
        )
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise SimApiError(
            400, f"a stop string is longer than {MAX_STOP_CHARS} characters", param="stop"
        )
    return stops


def check_penalties(
    *, presence: float | None, frequency: float | None, repetition: float | None
) -> None:
    """vLLM's refusal of a penalty out of its bounds (None: not given, vLLM's default)."""
    if presence is not None and not -2.0 <= presence <= 2.0:
        raise SimApiError(400, f"presence_penalty must be in [-2, 2], got {presence}.")
    if frequency is not None and not -2.0 <= frequency <= 2.0:
        raise SimApiError(400, f"frequency_penalty must be in [-2, 2], got {frequency}.")
    if repetition is not None and not math.isfinite(repetition):
        raise SimApiError(400, f"repetition_penalty must be a finite number, got {repetition}.")
    if repetition is not None and repetition <= 0.0:
        raise SimApiError(400, f"repetition_penalty must be greater than zero, got {repetition}.")


def check_bounds(*, temperature: float | None, top_p: float | None, top_k: int | None) -> None:
    """vLLM's refusal of a temperature, top_p or top_k out of its bounds (None: not given);
    top_k -1 is vLLM's old "disabled", still taken."""
    if temperature is not None and not math.isfinite(temperature):
        raise SimApiError(
            400, f"temperature must be a finite number, got {temperature}.", param="temperature"
        )
    if temperature is not None and temperature < 0.0:
        raise SimApiError(
            400, f"temperature must be non-negative, got {temperature}.", param="temperature"
        )
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise SimApiError(400, f"top_p must be in (0, 1], got {top_p}.", param="top_p")
    if top_k is not None and top_k < -1:
        raise SimApiError(400, f"top_k must be 0 (disable), or at least 1, got {top_k}.")
