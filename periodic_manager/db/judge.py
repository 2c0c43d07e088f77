"""The SQL side of the one judge (:mod:`periodic_manager.schedules.judge`): what a raw
``periodic_jobs`` row (:mod:`periodic_manager.db.rows`) is to a manager. Each column is decoded (a
decoding error is the row's error, named first), the values go to the judge, and its first
problem is the row's :class:`~periodic_manager.contracts.RowError`. :func:`judge` (the API's
trigger, the backfill) and :func:`periodic_manager.db.view.view` build on :func:`judge_content`;
:class:`RowJudge` is the same judge for a provider that reads many rows: it remembers verdicts on
values rows repeat (a spec in its zone, a task type, an options text, a row's shape): cost only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from periodic_manager.contracts import RowError
from periodic_manager.db.rows import (
    EFFECTIVE,
    N_JUDGED,
    effective_at,
    epoch_instant,
    json_value,
    judge_enabled,
    plain_jsonb,
    sqlite_instant,
    utf8,
)
from periodic_manager.errors import ConfigError
from periodic_manager.plugins import task_rules
from periodic_manager.schedules.calendars import CalendarSpec
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.judge import NAME_RE, Deployment, Judge
from periodic_manager.schedules.rules import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    PendingJson,
    TargetSet,
    refuse_foreign_options,
    target_refusal,
    validate_target,
)

Check = Callable[[PeriodicTaskConfig], None]
# Reads a row's task type, payload text and options: what its target refuses (validate_task).
TaskCheck = Callable[[str, str, Mapping[str, Any]], None]


@dataclass(frozen=True, slots=True)
class Rules:
    """How rows are judged in one deployment: the backend, the size limit of payload and
    options, the configured targets (None: any known target), and an optional further check.

    ``check`` may read a config's spec, zone, task type and options, never its name or payload:
    :class:`RowJudge` does not ask again for a row whose shape (those four) it has already
    found valid (a cold start of 100,000 rows of a few shapes checks a few)."""

    sqlite: bool
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    check: Check | None = None
    # The usable calendars by name (db/calendars.py), read by whoever judges: a row whose
    # options.exclude names another is a row error. None: not read (options.exclude unresolved).
    calendars: Mapping[str, CalendarSpec] | None = None
    # What the row's target refuses in its task (plugins/task_rules.py), the judge's verdict for
    # less: asked for every row, a row of a known shape too (it reads the payload). None: no
    # configured target has a rule.
    task_check: TaskCheck | None = None
    targets: Collection[str] | None = None

    def with_calendars(self, calendars: Mapping[str, CalendarSpec]) -> Rules:
        return replace(self, calendars=calendars)

    @property
    def deployment(self) -> Deployment:
        return Deployment(self.max_payload_bytes, self.targets, self.calendars)


def rules_for(sqlite: bool, max_payload_bytes: int, targets: Collection[str] | None) -> Rules:
    """The rules of a deployment that runs ``targets`` (``Settings.configured_targets()``): a
    row whose ``options.target`` names another, or whose ``options.overlap`` needs a completion
    signal its target lacks there, or whose task its target refuses (:func:`task_check`), is a
    row error, as the manager and the API both say. None: any target (no deployment check)."""
    if targets is None:
        return Rules(sqlite, max_payload_bytes)
    return Rules(sqlite, max_payload_bytes, task_check=task_check(targets), targets=targets)


def target_check(targets: Collection[str]) -> Check:
    """A check for :class:`Rules`: raises ConfigError for a config whose ``options.target`` is
    not among ``targets``, or whose ``options.overlap`` needs a completion signal its target
    lacks (the judge's target rule, for a config made elsewhere)."""

    def check(config: PeriodicTaskConfig) -> None:
        validate_target(config.options, targets)

    return check


def task_check(targets: Collection[str]) -> TaskCheck | None:
    """The task check of :func:`rules_for`: raises ConfigError for a row whose target (its
    ``options.target``, else the default) refuses its task whenever it is sent
    (:func:`~periodic_manager.schedules.rules.validate_task`); None when none of ``targets``
    declares a rule (nothing to ask per row)."""
    foreign = any(set(by) & set(targets) for by in task_rules.target_options().values())
    if not isinstance(targets, TargetSet) or not (task_rules.has_rules(targets) or foreign):
        return None
    # validate_task's verdict, for less: asked for every row of a full read.
    rules = {name: rule for name in targets if (rule := task_rules.rule_of(name)) is not None}
    default = rules.get(targets[0])

    def check(task_type: str, payload_json: str, options: Mapping[str, Any]) -> None:
        name = options.get("target")
        refuse_foreign_options(options, targets[0] if name is None else name, targets)
        rule = default if name is None else rules.get(name)
        if rule is not None and (problem := rule(task_type, payload_json, options)) is not None:
            raise target_refusal(targets[0] if name is None else name, problem)

    return check


def judge_content(rules: Rules, raw: Sequence[Any]) -> PeriodicTaskConfig | RowError:
    """The config of a raw row (``enabled`` aside), or the RowError naming its first bad field.

    Never raises: whatever a row holds, the others go on.
    """
    return _judge_for(rules).content(raw)


def judge(rules: Rules, raw: Sequence[Any]) -> PeriodicTaskConfig | RowError | None:
    """What the manager does with a raw row: None when it is disabled (nothing to schedule),
    else its config or the RowError to report (a bad ``enabled`` is reported, never skipped)."""
    return _judge_for(rules)(raw)


_last: list[RowJudge] = []  # the judge of the last rules asked for (one slot)


def _judge_for(rules: Rules) -> RowJudge:
    """The judge of ``rules``, kept while they are asked for: a page's rows share its memos."""
    if not _last or _last[0].rules is not rules:
        _last[:] = [RowJudge(rules)]
    return _last[0]


class _Known:
    """The options of a row whose options text an earlier row had: the verdict on it."""

    __slots__ = ("verdict",)

    def __init__(self, verdict: tuple[dict[str, Any], str] | ConfigError) -> None:
        self.verdict = verdict


class RowJudge(Judge):
    """The judge of raw rows: each column decoded, then judged by
    :class:`~periodic_manager.schedules.judge.Judge`, whose steps it memoises for what rows
    repeat (a spec in its zone, a task type, an options text, an ``effective_at``), sharing the
    repeated strings; a row whose shape (spec, zone, task type, options) a valid row had only has
    its name and payload checked. The verdicts are the judge's, field for field.

    ``raw[N_JUDGED]``, when present, is the row's revision, kept on its config.
    """

    MEMO_MAX = 100_000  # distinct values remembered per kind (then forgotten and relearned)

    def __init__(self, rules: Rules) -> None:
        super().__init__(rules.deployment)
        self._rules = rules
        # What valid rows become: a PeriodicTaskConfig, or a subclass a manager adopts as is
        # (its scheduler's entries: one object per schedule from the read on, never a copy).
        self.config_class: type[PeriodicTaskConfig] = PeriodicTaskConfig
        self.jsonb = False  # the payload column is of type jsonb (its text is valid JSON)
        self._strings: dict[str, str] = {}
        self._task_types: dict[str, ConfigError | None] = {}
        self._schedules: dict[tuple[str, str], Any] = {}
        self._options: dict[Any, tuple[Any, str] | ConfigError] = {}  # raw text -> verdict
        self._options_raw: Any = None  # the raw options text of the row being judged
        self._instants: dict[Any, datetime] = {}
        # (spec, timezone, task_type, options text) of valid rows -> their shared values
        self._shapes: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    @property
    def rules(self) -> Rules:
        return self._rules

    @rules.setter
    def rules(self, rules: Rules) -> None:  # a read's calendars: options.exclude follows them
        self._rules = rules
        self.deployment = rules.deployment

    def __call__(self, raw: Sequence[Any]) -> PeriodicTaskConfig | RowError | None:  # type: ignore[override]
        try:
            if not judge_enabled(self.rules.sqlite, raw[1]):
                return None
        except ConfigError as exc:
            return _row_error(raw, exc.field, exc.reason, exc.code)
        return self.content(raw)

    def content(self, raw: Sequence[Any]) -> PeriodicTaskConfig | RowError:
        """The config of a raw row (``enabled`` aside), or its RowError; never raises."""
        try:
            return self._content(raw)
        except ConfigError as exc:
            return _row_error(raw, exc.field, exc.reason, exc.code)
        except Exception as exc:
            # A row must never stop the others, even if it trips something unforeseen.
            return _row_error(raw, "row", f"unexpected {type(exc).__name__}: {exc}", "value_error")

    def _content(self, raw: Sequence[Any]) -> PeriodicTaskConfig:
        rules = self.rules
        name, spec, timezone, anchor, task_type, payload_raw, options_raw = raw[2:EFFECTIVE]
        shaped = anchor is None and not rules.sqlite
        if shaped:
            # A row like one already found valid in all but its name and payload: only those
            # two are checked (if either fails, the full path below names the error).
            known = self._shapes.get((spec, timezone, task_type, options_raw))
            if known is not None and type(name) is str and NAME_RE.match(name):
                pending = plain_jsonb(payload_raw, rules.max_payload_bytes, self.jsonb)
                if pending is not None:
                    spec, timezone, task_type, opts, options_json = known
                    # No rules.check: it reads the shape alone (see Rules), and this shape
                    # passed it when it was remembered. The task check reads the payload.
                    self.task(task_type, pending, opts)
                    config = self.config_class.of_row(
                        name,
                        spec,
                        task_type,
                        opts,
                        options_json,
                        timezone,
                        None,
                        raw[0],
                        self._effective_at(raw[EFFECTIVE]),
                        pending,
                        raw[N_JUDGED] if len(raw) > N_JUDGED else None,
                    )
                    config.exclusion = self.exclusion(opts)
                    return config
        config = self._full(raw)
        if shaped:
            self._remember(
                self._shapes,
                (spec, timezone, task_type, options_raw),
                (
                    config.spec,
                    config.timezone,
                    config.task_type,
                    config.options,
                    config.options_json,
                ),
            )
        return config

    def _full(self, raw: Sequence[Any]) -> PeriodicTaskConfig:
        """Every column decoded, in column order (a decoding error is the row's first), then
        judged."""
        rules = self.rules
        name, spec, timezone, anchor, task_type, payload, options = raw[2:EFFECTIVE]
        if rules.sqlite:
            name = utf8("name", name)
        spec, timezone = self._text("spec", spec), self._text("timezone", timezone)
        if anchor is not None:
            anchor = (
                sqlite_instant("anchor", utf8("anchor", anchor))
                if rules.sqlite
                else epoch_instant("anchor", anchor)
            )
        task_type = self._text("task_type", task_type)
        pending = (
            None if rules.sqlite else plain_jsonb(payload, rules.max_payload_bytes, self.jsonb)
        )
        payload = pending if pending is not None else json_value("payload", payload)
        self._options_raw = options
        known = self._options.get(options)
        if known is not None:
            options = _Known(known)
        else:  # SQL NULL and JSON null read as {}: no options
            options = json_value("options", options)
            options = {} if options is None else options
        fields = {
            "name": name,
            "spec": spec,
            "timezone": timezone,
            "anchor": anchor,
            "task_type": task_type,
            "payload": payload,
            "options": options,
        }
        verdict = super().__call__(fields)
        if isinstance(verdict, list):
            raise verdict[0].error()
        revision = raw[N_JUDGED] if len(raw) > N_JUDGED else None
        config = self.config_class.of_judged(
            verdict, raw[0], self._effective_at(raw[EFFECTIVE]), revision
        )
        if rules.check is not None:
            rules.check(config)
        return config

    # -- the judge's steps, remembered -------------------------------------------------------

    def task_type(self, value: Any) -> str:
        self._memo(self._task_types, value, super().task_type)
        return str(value)

    def payload(self, value: Any) -> str | PendingJson:
        if isinstance(value, PendingJson):  # proven valid and within the limits (plain_jsonb)
            return value
        return super().payload(value)

    def options(self, value: Any) -> tuple[dict[str, Any], str]:
        if isinstance(value, _Known):
            verdict = value.verdict
        else:
            try:
                verdict = super().options(value)
            except ConfigError as exc:
                verdict = exc
            self._remember(self._options, self._options_raw, verdict)
        if isinstance(verdict, ConfigError):
            raise verdict
        return verdict

    def schedule(self, spec: Any, timezone: Any, anchor: datetime | None) -> Any:
        if anchor is not None:
            return super().schedule(spec, timezone, anchor)
        key = (spec, timezone)
        try:
            verdict = self._schedules[key]
        except KeyError:
            try:
                verdict = super().schedule(spec, timezone, None)
            except ConfigError as exc:
                verdict = exc
            self._remember(self._schedules, key, verdict)
        except TypeError:  # unhashable: judged, not remembered
            return super().schedule(spec, timezone, None)
        if isinstance(verdict, ConfigError):
            raise verdict
        return verdict

    def task(self, task_type: str, payload: str | PendingJson, options: Mapping[str, Any]) -> None:
        check = self.rules.task_check
        if check is None:
            super().task(task_type, payload, options)
        else:
            check(task_type, payload.text if isinstance(payload, PendingJson) else payload, options)

    # -- memos -------------------------------------------------------------------------------

    def _text(self, name: str, value: Any) -> Any:
        """A text column, decoded and shared with every row that holds the same text."""
        if type(value) is not str:
            value = utf8(name, value)
            if type(value) is not str:
                return value  # None or another type: the checks name it
        shared = self._strings.get(value)
        if shared is None:
            self._remember(self._strings, value, value)
            return value
        return shared

    def _memo(
        self, memo: dict[Any, ConfigError | None], value: Any, check: Callable[[Any], Any]
    ) -> None:
        try:
            verdict = memo[value]
        except KeyError:
            try:
                check(value)
                verdict = None
            except ConfigError as exc:
                verdict = exc
            self._remember(memo, value, verdict)
        except TypeError:  # unhashable or odd: checked, not remembered
            check(value)
            return
        if verdict is not None:
            raise verdict

    def _effective_at(self, value: Any) -> datetime:
        instant = self._instants.get(value)
        if instant is None:
            instant = effective_at(self.rules.sqlite, value)
            if value is not None:
                self._remember(self._instants, value, instant)
        return instant

    def _remember(self, memo: dict[Any, Any], key: Any, value: Any) -> None:
        if len(memo) >= self.MEMO_MAX:
            memo.clear()
        memo[key] = value


def _row_error(raw: Sequence[Any], field: str, reason: str, code: str) -> RowError:
    name = raw[2]
    if isinstance(name, bytes):  # name the row in the error if its name is text at all
        name = name.decode("utf-8", errors="replace")
    revision = raw[N_JUDGED] if len(raw) > N_JUDGED else None
    return RowError(
        schedule_id=raw[0],
        name=name if isinstance(name, str) else None,
        content_hash=raw_hash(raw[:N_JUDGED]),
        field=field,
        reason=reason,
        code=code,
        revision=revision if type(revision) is int else None,
    )


def raw_hash(raw: Sequence[Any]) -> str:
    """sha256 of raw column values: changes whenever any of them changes."""
    doc = [_raw_repr(v) for v in raw]
    return hashlib.sha256(json.dumps(doc, ensure_ascii=True).encode()).hexdigest()


def _raw_repr(value: Any) -> Any:
    if value is None or isinstance(value, str | int):  # bool is an int
        return value
    if isinstance(value, bytes):
        return "x:" + value.hex()
    return repr(value)
