"""`run_probe(job) -> report`: one model, every conversation, every size and path. Never raises.

mlx and mlx_lm are optional (installed on the Mac, or with the `probe` extra): they are imported
inside the functions that run a model, never at module level, so the main side can import this
module without them. probe's own modules import mlx lazily too, so they load here at the top.
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

from checks.conversations import request_ends
from checks.reuse import HYBRID, HYBRID_CHECKPOINTS, TRIMMABLE, Stored, reused
from probe.correctness import (
    DEFAULT_THRESHOLD,
    LogprobComparison,
    SuffixOnlyClient,
    compare_logprobs,
)
from probe.download import DownloadError, DownloadSpec, downloaded_model
from probe.library_path import (
    PROMPT_CACHE_SIZE,
    LibraryEngine,
    ModelRunner,
    ReplyPlan,
    ServedRequest,
    cache_layers,
)
from probe.machine import describe_machine
from probe.measurements import (
    MISS_BELOW,
    ConversationResult,
    Correctness,
    PairResult,
    ProbeReport,
    RepeatResult,
    error_report,
    job_summary,
)
from probe.rendering import (
    ChatRequest,
    RenderedPrompt,
    common_prefix,
    forced_reply,
    parse_request,
    render_prompt,
)
from probe.server_path import serve_conversation

logger = logging.getLogger(__name__)

LIBRARY_PATHS = ("library", "library_checkpoints", "suffix_only_client")
ALL_PATHS = (*LIBRARY_PATHS, "server")
DEFAULT_PATHS = ("library", "library_checkpoints")
PAD_SENTENCE = "The probe pads this system prompt so that cache reuse is measured at size. "


@dataclass
class ProbeSettings:
    """The job's knobs, validated."""

    paths: list[str]
    prompt_sizes: list[int]
    reply_mode: str = "forced"
    max_reply_tokens: int = 8
    repeats: int = 3
    threshold: float = 0.1
    miss_below: float = MISS_BELOW
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    server_startup_timeout_s: float = 120.0
    deadline_s: float | None = None
    prompt_cache_size: int = 10

    @classmethod
    def from_job(cls, job: dict[str, Any]) -> ProbeSettings:
        paths = list(job.get("paths") or DEFAULT_PATHS)
        unknown = sorted(set(paths) - set(ALL_PATHS))
        if unknown:
            raise ValueError(f"unknown paths {unknown}; known: {list(ALL_PATHS)}")
        mode = str(job.get("reply_mode", "forced"))
        if mode not in ("forced", "generated"):
            raise ValueError(f"reply_mode must be forced or generated, not {mode!r}")
        settings = cls(
            paths=paths,
            prompt_sizes=[int(s) for s in job.get("prompt_sizes") or [0]],
            reply_mode=mode,
            max_reply_tokens=int(job.get("max_reply_tokens", 8)),
            repeats=max(1, int(job.get("repeats", 3))),
            threshold=float(job.get("threshold", DEFAULT_THRESHOLD)),
            miss_below=float(job.get("miss_below", MISS_BELOW)),
            template_kwargs=dict(job.get("template_kwargs") or {}),
            server_startup_timeout_s=float(job.get("server_startup_timeout_s", 120.0)),
            deadline_s=float(job["deadline_s"]) if job.get("deadline_s") is not None else None,
            prompt_cache_size=int(job.get("prompt_cache_size", PROMPT_CACHE_SIZE)),
        )
        if settings.max_reply_tokens < 1:
            raise ValueError("max_reply_tokens must be >= 1")
        return settings


def parse_conversations(job: dict[str, Any]) -> dict[str, list[ChatRequest]]:
    """Each conversation as its requests (at least 2).

    Accepted: {name: [request, ...]}, {name: {"requests": [...], "tools": [...]}}, or a whole
    session {name: {"messages": [...], "tools": [...]}} cut into requests the way the check
    engine cuts its sessions.
    """
    raw = job.get("conversations")
    if not isinstance(raw, dict) or not raw:
        raise ValueError("job has no conversations")
    out: dict[str, list[ChatRequest]] = {}
    for name, conv in raw.items():
        tools = None
        if isinstance(conv, dict):
            tools = conv.get("tools")
            conv = (
                conv["requests"] if "requests" in conv else session_requests(conv.get("messages"))
            )
        if not isinstance(conv, list) or len(conv) < 2:
            raise ValueError(f"conversation {name!r} needs at least two requests")
        requests = [parse_request(r) for r in conv]
        out[str(name)] = [ChatRequest(r.messages, r.tools or tools) for r in requests]
    return out


def session_requests(messages: Any) -> list[list[dict[str, Any]]]:
    """The requests a client sends during that session, cut by the check engine's own rule
    (`checks.conversations.request_ends`)."""
    if not isinstance(messages, list):
        raise ValueError("a session needs a list of messages")
    if not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError("every message must be a dict with a role")
    return [messages[:end] for end in request_ends(messages)]


def run_probe(job: dict[str, Any]) -> dict[str, Any]:
    """Run one probe job and return its JSON report; every failure becomes status "error"."""
    started = time.perf_counter()
    try:
        machine = describe_machine()
    except Exception as exc:  # the report must still go out
        machine = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        settings = ProbeSettings.from_job(job)
        conversations = parse_conversations(job)
        if job.get("model_dir"):
            report = _probe_dir(Path(job["model_dir"]), job, settings, conversations, machine)
        else:
            with downloaded_model(DownloadSpec.from_job(job)) as (path, commit):
                report = _probe_dir(path, job, settings, conversations, machine)
                report.model["commit"] = commit
    except DownloadError as exc:
        logger.warning("probe job failed: %s", exc)
        return error_report(job, machine, str(exc))
    except Exception as exc:
        logger.warning("probe job failed", exc_info=True)
        return error_report(job, machine, describe_failure(exc))
    finally:
        _release_memory()
    report.seconds = round(time.perf_counter() - started, 3)
    return report.to_dict()


def describe_failure(exc: BaseException) -> str:
    """One line for the report; out-of-memory is named as such whatever raised it."""
    text = f"{type(exc).__name__}: {exc}"
    # Metal reports exhaustion as a RuntimeError ("Insufficient Memory"), not MemoryError.
    lowered = text.lower()
    if (
        isinstance(exc, MemoryError)
        or "insufficient memory" in lowered
        or "out of memory" in lowered
    ):
        return f"out of memory: {text}"
    return text


def _release_memory() -> None:
    """Give the model's buffers back before the next job (MLX keeps a buffer pool)."""
    gc.collect()
    mx = sys.modules.get("mlx.core")
    if mx is not None:
        mx.clear_cache()


def _load(model_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    import mlx_lm

    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} does not exist")
    try:
        loaded: Any = mlx_lm.load(str(model_dir), return_config=True)
    except Exception as exc:
        raise RuntimeError(f"model failed to load: {type(exc).__name__}: {exc}") from exc
    model, tokenizer, config = loaded
    return model, tokenizer, dict(config)


def _probe_dir(
    model_dir: Path,
    job: dict[str, Any],
    settings: ProbeSettings,
    conversations: dict[str, list[ChatRequest]],
    machine: dict[str, Any],
) -> ProbeReport:
    import mlx.core as mx

    tic = time.perf_counter()
    model, tokenizer, config = _load(model_dir)
    runner = ModelRunner(model, tokenizer)
    report = ProbeReport(
        "ok",
        job_summary(job),
        machine,
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        settings=dict(vars(settings)),
        model={
            "model_type": config.get("model_type"),
            "load_seconds": round(time.perf_counter() - tic, 3),
            "cache_layers": cache_layers(runner.new_cache()),
            "has_thinking": bool(tokenizer.has_thinking),
            "weights_bytes": int(mx.get_active_memory()),
        },
    )
    predicted = job.get("predicted") or {}
    for name, requests in conversations.items():
        for size in settings.prompt_sizes:
            if settings.deadline_s is not None and time.perf_counter() - tic > settings.deadline_s:
                # Stop cleanly inside the task's time limit: what was measured still goes back.
                for path in settings.paths:
                    skipped = ConversationResult(name, size, path, settings.reply_mode)
                    skipped.error = f"skipped: job deadline of {settings.deadline_s:g} s reached"
                    report.results.append(skipped)
                continue
            logger.info("probing %s at %d tokens: %s", name, size, ", ".join(settings.paths))
            report.results.extend(
                _probe_conversation(
                    runner, model_dir, name, requests, size, predicted.get(name), settings
                )
            )
    return report


@dataclass
class _Prepared:
    """A conversation at one size, rendered once for every path."""

    requests: list[ChatRequest]
    prompts: list[RenderedPrompt]
    forced: list[list[int] | None]
    cold_ms: dict[int, float]
    cold_logprobs: dict[int, Any]
    predicted: list[int | None]


def _probe_conversation(
    runner: ModelRunner,
    model_dir: Path,
    name: str,
    requests: list[ChatRequest],
    size: int,
    predicted: list[int] | None,
    settings: ProbeSettings,
) -> list[ConversationResult]:
    results: list[ConversationResult] = []
    try:
        prep = _prepare(runner, requests, size, predicted, settings)
    except Exception as exc:
        for path in settings.paths:
            result = ConversationResult(name, size, path, settings.reply_mode)
            result.error = describe_failure(exc)
            results.append(result)
        return results
    generated_ref: ConversationResult | None = None
    for path in settings.paths:
        mode = "generated" if path == "server" else settings.reply_mode
        try:
            if path == "server":
                if generated_ref is None:
                    # The server generates its own replies: compare it with the library path
                    # fed the same greedy replies, and show that run too.
                    generated_ref = _library_run(
                        runner, prep, name, size, "library_checkpoints", "generated", settings
                    )
                    results.append(generated_ref)
                result = _server_run(model_dir, prep, name, size, generated_ref, settings)
            else:
                result = _library_run(runner, prep, name, size, path, mode, settings)
                if path == "library_checkpoints" and mode == "generated":
                    generated_ref = result
        except Exception as exc:
            result = ConversationResult(name, size, path, mode)
            result.error = describe_failure(exc)
        results.append(result)
    return results


def pad_requests(requests: list[ChatRequest], size: int, tokenizer: Any) -> list[ChatRequest]:
    """Grow every request's system prompt by the same ~`size` tokens (0: unchanged)."""
    if size <= 0:
        return requests
    per_sentence = max(1, len(tokenizer.encode(PAD_SENTENCE, add_special_tokens=False)))
    filler = PAD_SENTENCE * max(1, size // per_sentence)
    padded = []
    for r in requests:
        messages = [dict(m) for m in r.messages]
        if messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
            messages[0]["content"] = filler + "\n\n" + messages[0]["content"]
        else:
            messages.insert(0, {"role": "system", "content": filler.rstrip()})
        padded.append(ChatRequest(messages, r.tools))
    return padded


def _prepare(
    runner: ModelRunner,
    requests: list[ChatRequest],
    size: int,
    predicted: list[int] | None,
    settings: ProbeSettings,
) -> _Prepared:
    tok, kwargs = runner.tokenizer, settings.template_kwargs
    padded = pad_requests(requests, size, tok)
    prompts = [render_prompt(tok, r, kwargs) for r in padded]
    forced: list[list[int] | None] = [
        forced_reply(tok, padded[k], padded[k + 1], prompts[k].tokens, kwargs)
        for k in range(len(padded) - 1)
    ] + [None]
    # The check engine predicts on the unpadded prompts: shift predictions that lie past the
    # point where padding entered, by the tokens it added.
    shifted: list[int | None] = [None] * (len(padded) - 1)
    if predicted is not None:
        plain = render_prompt(tok, requests[0], kwargs).tokens
        entered = common_prefix(plain, prompts[0].tokens)
        added = len(prompts[0].tokens) - len(plain)
        for k, value in enumerate(predicted[: len(shifted)]):
            shifted[k] = int(value) + (added if value > entered else 0)
    cold_ms: dict[int, float] = {}
    cold_logprobs: dict[int, Any] = {}
    for k in range(1, len(prompts)):
        times = []
        for _ in range(settings.repeats):
            seconds, logprobs = runner.cold(prompts[k].tokens)
            times.append(seconds * 1000)
            cold_logprobs.setdefault(k, logprobs)
        cold_ms[k] = median(times)
    return _Prepared(padded, prompts, forced, cold_ms, cold_logprobs, shifted)


def _correctness(comparison: LogprobComparison) -> Correctness:
    return Correctness(
        round(comparison.max_abs_delta, 6),
        comparison.same_greedy,
        comparison.threshold,
        comparison.ok,
    )


def _timed(serve: Callable[[bool], ServedRequest], repeats: int) -> tuple[ServedRequest, float]:
    """Timing repeats leave the cache as it was; the last serve stores, as the server would."""
    times = [serve(False).ttft_s for _ in range(repeats - 1)]
    served = serve(True)
    times.append(served.ttft_s)
    return served, median(times) * 1000


def _library_run(
    runner: ModelRunner,
    prep: _Prepared,
    name: str,
    size: int,
    path: str,
    mode: str,
    settings: ProbeSettings,
) -> ConversationResult:
    import mlx.core as mx

    tic = time.perf_counter()
    mx.reset_peak_memory()
    engine: LibraryEngine | SuffixOnlyClient
    if path == "suffix_only_client":
        engine = SuffixOnlyClient(runner)
    else:
        engine = LibraryEngine(
            runner,
            checkpoints=path == "library_checkpoints",
            cache_size=settings.prompt_cache_size,
        )
    result = ConversationResult(name, size, path, mode)
    result.predicted_source = "job" if any(p is not None for p in prep.predicted) else "probe"
    keys: list[list[int]] = []
    stored: list[Stored] = []
    seen: list[list[Stored]] = []  # what was stored before each request
    for k, prompt in enumerate(prep.prompts):
        seen.append(list(stored))
        plan = ReplyPlan(prep.forced[k] if mode == "forced" else None, settings.max_reply_tokens)

        def serve(store: bool, prompt: RenderedPrompt = prompt, plan: ReplyPlan = plan) -> Any:
            return engine.serve(prompt, plan, store)

        served, warm_ms = _timed(serve, settings.repeats if k else 1)
        if k:
            previous = keys[-1]
            # A generated reply is not what the next request sends back: only the prompt
            # before it counts as what the engine should keep.
            forced_before = mode == "forced" and prep.forced[k - 1] is not None
            held = len(previous) if forced_before else len(prep.prompts[k - 1].tokens)
            check = compare_logprobs(prep.cold_logprobs[k], served.logprobs, settings.threshold)
            result.pairs.append(
                PairResult(
                    index=k + 1,
                    prompt_tokens=len(prompt.tokens),
                    held_tokens=held,
                    reusable_tokens=common_prefix(previous, prompt.tokens),
                    predicted_tokens=prep.predicted[k - 1],
                    reused_tokens=served.reused_tokens,
                    cold_ttft_ms=round(prep.cold_ms[k], 3),
                    warm_ttft_ms=round(warm_ms, 3),
                    correctness=_correctness(check),
                    note=served.note,
                )
            )
        keys.append(prompt.tokens + served.reply)
        stored.append(Stored(keys[-1], tuple(served.checkpoints)))
        result.kv_snapshot_bytes = served.kv_bytes
    last = len(prep.prompts) - 1

    def repeat(store: bool) -> Any:
        return engine.serve(prep.prompts[last], ReplyPlan(None, settings.max_reply_tokens), store)

    served, warm_ms = _timed(repeat, settings.repeats)
    check = compare_logprobs(prep.cold_logprobs[last], served.logprobs, settings.threshold)
    result.exact_repeat = RepeatResult(
        len(prep.prompts[last].tokens),
        served.reused_tokens,
        round(prep.cold_ms[last], 3),
        round(warm_ms, 3),
        _correctness(check),
    )
    result.cache_layers = engine.last_layers
    if isinstance(engine, LibraryEngine):
        result.prompt_cache_bytes = int(engine.lru.nbytes)
        _estimate(result, engine, prep, seen, stored)
    result.peak_memory_bytes = int(mx.get_peak_memory())
    result.seconds = round(time.perf_counter() - tic, 3)
    result.decide(settings.miss_below)
    return result


def _estimate(
    result: ConversationResult,
    engine: LibraryEngine,
    prep: _Prepared,
    seen: list[list[Stored]],
    stored: list[Stored],
) -> None:
    """Set what checks.reuse estimates for this path's cache class from the same tokens, beside
    what the engine measured: the check engine's per-class figures rest on these rules."""
    trimmable = all(layer["trimmable"] for layer in engine.last_layers)
    cache_class = TRIMMABLE if trimmable else HYBRID_CHECKPOINTS if engine.checkpoints else HYBRID
    result.cache_class = cache_class
    agrees = True
    for pair in result.pairs:
        k = pair.index - 1
        pair.estimated_tokens = reused(cache_class, seen[k], prep.prompts[k].tokens)
        agrees &= pair.estimated_tokens == pair.reused_tokens
    if result.exact_repeat is not None:
        repeat = prep.prompts[-1].tokens
        result.exact_repeat.estimated_tokens = reused(cache_class, stored, repeat)
        agrees &= result.exact_repeat.estimated_tokens == result.exact_repeat.reused_tokens
    result.estimate_agrees = agrees


def _server_run(
    model_dir: Path,
    prep: _Prepared,
    name: str,
    size: int,
    reference: ConversationResult,
    settings: ProbeSettings,
) -> ConversationResult:
    tic = time.perf_counter()
    turns = serve_conversation(
        model_dir,
        prep.requests,
        max_tokens=settings.max_reply_tokens,
        template_kwargs=settings.template_kwargs or None,
        startup_timeout_s=settings.server_startup_timeout_s,
        prompt_cache_size=settings.prompt_cache_size,
    )
    result = ConversationResult(name, size, "server", "generated")
    result.predicted_source = reference.predicted_source
    for k, (turn, ref) in enumerate(zip(turns[1:-1], reference.pairs, strict=True), start=1):
        result.pairs.append(
            PairResult(
                index=k + 1,
                prompt_tokens=turn.prompt_tokens,
                held_tokens=turns[k - 1].prompt_tokens,
                reusable_tokens=ref.reusable_tokens,
                predicted_tokens=ref.predicted_tokens,
                reused_tokens=turn.cached_tokens,
                cold_ttft_ms=None,  # a black box cannot be made cold without a restart
                warm_ttft_ms=turn.ttft_ms,
                correctness=None,
            )
        )
    repeat = turns[-1]
    result.exact_repeat = RepeatResult(
        repeat.prompt_tokens, repeat.cached_tokens, None, repeat.ttft_ms, None
    )
    result.seconds = round(time.perf_counter() - tic, 3)
    result.decide(settings.miss_below)
    ours = [p.reused_tokens for p in reference.pairs]
    if reference.exact_repeat is not None:
        ours.append(reference.exact_repeat.reused_tokens)
    theirs = [t.cached_tokens for t in turns[1:]]
    result.agrees_with = {
        "path": reference.path,
        "reply_mode": reference.reply_mode,
        "reused_tokens": ours,
        "server_cached_tokens": theirs,
        "agree": ours == theirs,
        "prompt_tokens_agree": [t.prompt_tokens for t in turns]
        == [len(p.tokens) for p in prep.prompts] + [len(prep.prompts[-1].tokens)],
    }
    return result
