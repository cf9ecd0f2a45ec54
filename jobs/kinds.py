"""Registry of job kinds and named presets.

A kind is one :class:`JobKind` entry: a config model and a run function

    run(config, run_dir: Path, progress: core.progress.ProgressCallback) -> dict   # the report

The config model is a pydantic ``BaseModel`` (use ``extra="forbid"`` so typos are rejected),
given as the class or as a ``"module:attribute"`` string, imported
only when first needed, so that registering ``convert`` does not import torch into every CLI
call. The run function must checkpoint into ``run_dir``, resume from the checkpoint it finds
there, and, when ``progress.should_stop()`` returns True between steps, checkpoint and raise
:class:`core.progress.StopRequested`.

Adding a kind is one call, :func:`register_kind`. When the core function has extra parameters, the
entry points at a three-line adapter that imports the core function inside its body, so torch loads
in the job process only: the ``convert`` and ``budgets`` kinds below are the pattern.

``resume_safe`` lists the top-level config fields a resume may change (pacing, logging, fault injection);
a change to any other field changes what was trained and makes resume refuse, showing the diff.

Paths typed by a user go in fields annotated :data:`WorkspacePath`: validation rejects any value
that resolves outside the workspace (``../``, absolute paths elsewhere). The runner process's
working directory is the workspace (``Path.cwd()`` in a run function), so such a path opens as given.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, ValidationInfo,
                      field_validator, model_validator)

from core.config import PRESET_DESCRIPTIONS, LongContextSpec, evaluation_overrides
from core.config import PRESETS as CONVERT_PRESETS
from core.lists import comma_ints
from core.run_folder import EXPORT_CONFIG, REPORT_FILE, TASK_CACHE_DIR, is_export, is_run
from core.workspace import safe_child
from jobs.errors import ConfigError, UnknownKind
from jobs.models import FORMER_KIND_NAMES


def _inside_workspace(value: str, info: ValidationInfo) -> str:
    root = (info.context or {}).get("workspace")
    if root is None:  # no workspace known: accept only plain relative paths without `..`
        parts = Path(value).parts
        if Path(value).is_absolute() or ".." in parts:
            raise ValueError(f"path {value!r} must be relative to the workspace, without '..'")
        return value
    safe_child(Path(root), value)  # raises ValueError naming the path and the workspace
    return value


WorkspacePath = Annotated[str, AfterValidator(_inside_workspace)]
"""A path typed by the user, relative to the workspace; rejected if it escapes it."""


def _resolve(ref: Any) -> Any:
    if isinstance(ref, str):
        module, _, attr = ref.partition(":")
        return getattr(importlib.import_module(module), attr)
    return ref


@dataclass(frozen=True)
class JobKind:
    name: str
    config_model: type | str  # pydantic model, or "module:Class"
    run: Callable[[Any, Path, Any], dict] | str  # run(config, run_dir, progress) -> report, or "module:func"
    description: str = ""
    resume_safe: frozenset[str] = field(default_factory=frozenset)
    # check(config_obj, workspace) after validation, e.g. against the model's config.json; raises an
    # exception with ``field`` (the dotted path) and ``problem`` attributes for a config that cannot run.
    check: Callable[[Any, Path | None], None] | str | None = None

    def model(self) -> type:
        return _resolve(self.config_model)

    def function(self) -> Callable[[Any, Path, Any], dict]:
        return _resolve(self.run)

    def _adapter(self) -> TypeAdapter:
        return TypeAdapter(self.model())

    def validate(self, config: dict[str, Any], workspace: Path | None = None) -> Any:
        """The config object, or :class:`ConfigError` naming every bad field."""
        if not isinstance(config, dict):
            raise ConfigError(self.name, [("config", f"expected a mapping of field names to values, "
                                                     f"got {type(config).__name__}")])
        try:
            validated = self._adapter().validate_python(config, context={"workspace": workspace})
        except ValidationError as exc:
            raise ConfigError(self.name, _problems(exc)) from None
        if self.check is not None:
            try:
                _resolve(self.check)(validated, workspace)
            except ValueError as exc:
                if not hasattr(exc, "field"):
                    raise
                raise ConfigError(self.name, [(exc.field, exc.problem)]) from None
        return validated

    def dump(self, config_obj: Any) -> dict[str, Any]:
        """JSON-ready dict of a validated config (what the database stores)."""
        return self._adapter().dump_python(config_obj, mode="json")

    def normalize(self, config: dict[str, Any], workspace: Path | None = None) -> dict[str, Any]:
        return self.dump(self.validate(config, workspace))


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown field (a typo?)"
        elif "input" in err and not isinstance(err["input"], dict) and f"got {err['input']!r}" not in message:
            message += f" (got {err['input']!r})"
        problems.append((loc, message))
    return problems


JOB_KINDS: dict[str, JobKind] = {}

# the names of the kinds shipped below, for the pages and commands that submit or list them
# (bench and eval are named as their commands, `lolcats bench` and `lolcats eval`)
SELFTEST, CONVERT, BENCH, EVAL, EXPORT, BUDGETS = "selftest", "convert", "bench", "eval", "export", "budgets"


def register_kind(kind: JobKind, *, replace: bool = False) -> JobKind:
    if kind.name in JOB_KINDS and not replace:
        raise ValueError(f"job kind {kind.name!r} is already registered")
    JOB_KINDS[kind.name] = kind
    return kind


def kind_name(name: str) -> str:
    """The name of the kind ``name`` names: itself, or the kind a former name now reads as."""
    return FORMER_KIND_NAMES.get(name, name)


def get_kind(name: str) -> JobKind:
    """The registered kind of ``name`` (a former name reads as the kind's current one)."""
    try:
        return JOB_KINDS[kind_name(name)]
    except KeyError:
        raise UnknownKind(f"unknown job kind {name!r}; valid kinds: {', '.join(sorted(JOB_KINDS))}") from None


@dataclass(frozen=True)
class Preset:
    kind: str
    config: dict[str, Any]
    description: str = ""


PRESETS: dict[str, Preset] = {}


def register_preset(name: str, kind: str, config: dict[str, Any], description: str = "") -> Preset:
    PRESETS[name] = Preset(kind, dict(config), description)
    return PRESETS[name]


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UnknownKind(f"unknown preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}") from None


# --- kinds shipped with the job system ---------------------------------------------------------
register_kind(JobKind(
    name=SELFTEST,
    config_model="jobs.selftest:SelftestConfig",
    run="jobs.selftest:run_selftest",
    description="A tiny deterministic job that exercises checkpoints, metrics, failures and cancel.",
    resume_safe=frozenset({"step_seconds", "fail_at_step", "nan_at_step", "oom_at_step", "spawn_grandchild",
                           "ignore_stop", "ignore_sigterm", "output_path"}),
))
register_preset("selftest-quick", SELFTEST, {"steps": 5, "step_seconds": 0.05},
                "5 fast steps: checks that a worker runs jobs end to end")
register_preset("selftest-slow", SELFTEST, {"steps": 60, "step_seconds": 1.0},
                "one minute of steps: try cancel and resume by hand")


def run_convert_job(config, run_dir: Path, progress) -> dict:
    """The ``convert`` kind: a whole conversion run; a resumed job continues from its checkpoints."""
    from core.pipeline.convert import run_convert  # torch loads here, in the job process only

    return run_convert(config, run_dir, progress, resume=True, workspace=Path.cwd())


register_kind(JobKind(
    name=CONVERT,
    config_model="core.config:ConvertConfig",
    run=run_convert_job,
    check="core.pipeline.preflight:check_conversion",  # config.json and the data's first rows: no torch at submit
    description="Linearize a model's attention: attention transfer, LoRA, evaluation (report.json).",
))


def _register_convert_presets() -> None:
    """The conversion presets of core.config, with their one-line descriptions."""
    for name, config in CONVERT_PRESETS.items():
        register_preset(name, CONVERT, config, PRESET_DESCRIPTIONS[name])


_register_convert_presets()


def run_bench_job(config, run_dir: Path, progress) -> dict:
    """The ``bench`` kind: teacher vs student throughput and memory sweep (report.json)."""
    from core.bench import run_benchmark, write_result

    config = config.model_copy(update={"workspace": str(Path.cwd())})  # share the workspace's model cache
    result = run_benchmark(config, progress)
    write_result(result, run_dir / REPORT_FILE)
    return result


register_kind(JobKind(
    name=BENCH,
    config_model="core.bench:BenchConfig",
    run=run_bench_job,
    description="Throughput and memory, teacher vs converted student, over batch size and context length.",
    resume_safe=frozenset({"threads", "warmup"}),
))
register_preset("bench-cpu", BENCH, {"batch_sizes": [1, 4], "prompt_lengths": [256, 1024], "gen_lengths": [8],
                                           "threads": 1},
                "a few minutes on CPU: batch 1-4, context 256-1024")


class EvalConfig(BaseModel):
    """The ``eval`` kind's config: task accuracy (``tasks``) and / or quality by context length
    (``lengths``) of one converted model, teacher vs student; :func:`check_eval` refuses a
    config that asks for neither."""

    model_config = ConfigDict(extra="forbid")
    run: WorkspacePath  # a run folder (a conversion job's is runs/<id>) or an export, in the workspace
    tasks: str | None = None  # lm-eval task names, comma-separated, or 'paper' / 'offline' (None: no task accuracy)
    num_fewshot: int | None = Field(None, ge=0)  # None: each task's own count
    limit: int | None = Field(None, ge=1)  # at most this many items per task
    batch_size: int = Field(1, ge=1)
    # the run's evaluation step with quality by context length against the untrained window baselines and
    # the frontier (core.eval.long_context): token counts ("256,1024" is read as a list), "auto" (up to 8x
    # the training length), or None: not run
    lengths: list[int] | Literal["auto"] | None = None
    sequences: int | None = Field(None, ge=1)  # held-out sequences of the longest length (None: the run's)

    @field_validator("lengths", mode="before")
    @classmethod
    def _lengths(cls, value: Any) -> Any:
        """Comma-separated text read as a list, then checked and sorted as LongContextSpec does."""
        if value is None:
            return None
        if isinstance(value, str) and value.strip() != "auto":
            value = comma_ints(value, "lengths", example="256,1024 (or auto)")
        try:
            return LongContextSpec(lengths=value).lengths
        except ValidationError as exc:
            raise ValueError("; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())) from None

    def overrides(self) -> list[str]:
        """The run's eval settings this job changes, as dotted overrides (core.config.evaluation_overrides)."""
        return evaluation_overrides(lengths=self.lengths, sequences=self.sequences)




class Refused(ValueError):
    """A config that validates but cannot run (an eval or export job's): ``field`` names the
    field, ``problem`` says why."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


def check_eval(config: EvalConfig, workspace: Path | None) -> None:
    """Refuse at submit a config that asks for nothing, and a ``run`` that holds no converted model
    (reads file names only: no torch)."""
    if config.tasks is None and config.lengths is None:
        raise Refused("tasks", "nothing to evaluate: give tasks (offline, paper or lm-eval task names), "
                      "lengths (auto or token counts such as 256,1024,2048,4096), or both")
    path = Path(workspace or Path.cwd()) / config.run
    if not (is_run(path) or is_export(path)):
        raise Refused("run", f"{config.run!r} is not a converted run folder (config.json and stage "
                      f"checkpoints) or an export ({EXPORT_CONFIG}); give the run folder of a "
                      "finished conversion, e.g. runs/<job id>")


def run_eval_job(config: EvalConfig, run_dir: Path, progress) -> dict:
    """The ``eval`` kind (report.json), on the model loaded once: with ``tasks``, teacher and
    student on them (each finished task is kept in ``run_dir/tasks`` and a resumed job skips it);
    with ``lengths``, the run's own evaluation step with this job's fields as overrides of its eval
    settings (core.pipeline.convert.evaluate_again, as ``lolcats eval`` runs it): the same held-out
    text and rules as the conversion, its figures at the report's top level and its ``long_context``
    section, ``"auto"`` lengths relative to the run's training length ``data.seq_len``."""
    from core.eval.harness import evaluate_tasks  # torch and lm-eval load here, in the job process only
    from core.export.teacher import teacher_problem
    from core.pipeline.convert import evaluate_again
    from core.load import load_converted

    run = Path.cwd() / config.run
    model, tokenizer, info = loaded = load_converted(run, workspace=Path.cwd())
    report = {} if config.tasks is None else evaluate_tasks(
        run, config.tasks, num_fewshot=config.num_fewshot, limit=config.limit, batch_size=config.batch_size,
        progress=progress, workspace=Path.cwd(), cache_dir=run_dir / TASK_CACHE_DIR, loaded=loaded)
    if config.lengths is not None:
        report.update(evaluate_again(model, tokenizer, info["config"], config.overrides(), progress,
                                     teacher_unavailable=teacher_problem(model)))
    return report


register_kind(JobKind(
    name=EVAL,
    config_model=EvalConfig,
    run=run_eval_job,
    check=check_eval,
    description="Task accuracy (lm-evaluation-harness) and / or quality by context length of a converted model "
                "and its teacher (report.json).",
))


class ExportConfig(BaseModel):
    """The ``export`` kind's config: a standalone folder (LoRA merged) of a conversion's run folder,
    optionally uploaded to the Hugging Face Hub with the token the environment holds."""

    model_config = ConfigDict(extra="forbid")
    run: WorkspacePath  # a conversion's run folder (a conversion job's is runs/<id>), in the workspace
    output: WorkspacePath | None = None  # the export's folder (None: set to exports/<the run folder's name>)
    push_to_hub: str | None = Field(None, pattern=r"^[\w.\-]+/[\w.\-]+$")  # org/name, or None: no upload
    private: bool = False  # with push_to_hub: create the Hub repository as private

    @model_validator(mode="after")
    def _default_output(self):
        if self.output is None:
            self.output = f"exports/{Path(self.run).name}"
        return self


def check_export(config: ExportConfig, workspace: Path | None) -> None:
    """Refuse at submit a ``run`` that is not a conversion's run folder, an ``output`` that holds
    something other than an export (it is replaced), and an upload without a Hub token in the
    environment (``HF_TOKEN`` or a saved login: a token is never part of a job's config)."""
    root = Path(workspace or Path.cwd())
    if not is_run(root / config.run):
        raise Refused("run", f"{config.run!r} is not a converted run folder (config.json and stage "
                      "checkpoints); give the run folder of a finished conversion, e.g. runs/<job id>")
    out = root / config.output
    if out.exists() and not is_export(out) and (not out.is_dir() or any(out.iterdir())):
        raise Refused("output", f"{config.output!r} exists and is not an export; choose another folder "
                      "(an earlier export there is replaced)")
    if config.push_to_hub:
        from huggingface_hub import get_token

        if not get_token():
            raise Refused("push_to_hub", "no Hugging Face token in this environment: set HF_TOKEN for the "
                          "worker (or run `hf auth login` as its user), or leave push_to_hub empty")


def run_export_job(config: ExportConfig, run_dir: Path, progress) -> dict:
    """The ``export`` kind: the folder written beside (``.partial``) and then swapped in, so a killed
    job leaves the earlier export whole and a resumed one writes it again; the report gives the
    folder, its files and size, the model card and the snippet that loads it."""
    import shutil

    from core.export.card import CARD_FILE
    from core.export.folder import export, push_to_hub  # torch loads here, in the job process only

    out = Path.cwd() / config.output
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    export(Path.cwd() / config.run, partial, workspace=Path.cwd(), name=out.name)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    files = {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    return {
        "folder": config.output,
        "files": files,
        "bytes": sum(files.values()),
        "card": (out / CARD_FILE).read_text(encoding="utf-8"),
        "load": load_snippet(str(out)),
        "pushed": push_to_hub(out, config.push_to_hub, private=config.private) if config.push_to_hub else None,
    }


def load_snippet(folder: str) -> str:
    """Python that loads an export with plain transformers (its modeling code travels in the folder)."""
    return (f"from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"model = AutoModelForCausalLM.from_pretrained({folder!r}, trust_remote_code=True)\n"
            f"tokenizer = AutoTokenizer.from_pretrained({folder!r})")


register_kind(JobKind(
    name=EXPORT,
    config_model=ExportConfig,
    run=run_export_job,
    check=check_export,
    description="A standalone model folder (LoRA merged) that plain transformers loads, optionally pushed to the Hub.",
))


def run_budgets_job(config, run_dir: Path, progress) -> dict:
    """The ``budgets`` kind: the softmax-budget trade-off (budgets.json, budgets.md, budgets.html); a
    resumed job continues run by run."""
    from core.pipeline.budgets import run_budget_sweep  # torch loads here, in the job process only

    return run_budget_sweep(config, run_dir, progress, resume=True, workspace=Path.cwd())


register_kind(JobKind(
    name=BUDGETS,
    config_model="core.pipeline.budget_spec:BudgetSweepConfig",
    run=run_budgets_job,
    check="core.pipeline.budget_spec:check_sweep_fit",
    description="Quality vs decode cost with 0, 1, 2, ... layers kept softmax, from one attention transfer.",
))
register_preset("budgets-cpu-demo", BUDGETS, {"base": CONVERT_PRESETS["cpu-demo"], "budgets": [0, 1, 2, 4, 8]},
                "cpu-demo with 0, 1, 2, 4 and 8 layers kept softmax: quality vs decode cost")
