"""A search's study in its database: the storage URL checked before anything is written (reachable, its password
never shown), the stored study's space held to the new one, the sampler and pruner made, and which trials count
towards `--trials` (a trial killed and retried counts once).

The study lives in an Optuna RDBStorage: SQLite (`study.db` in the sweep folder) by default, or the database
`--storage` names, which workers on other machines join. Each worker beats a heartbeat while its trial runs; a trial
whose heartbeat has stopped (its worker killed, its machine lost) is failed and enqueued again with the same values
by Optuna's RetryHeartbeatStaleTrialCallback, and its run folder resumes from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.base.secrets import redact

STUDY_DB = "study.db"
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "halving", "none")
# The study's user attributes that a worker joining it must match.
SPACE_ATTR, OBJECTIVE_ATTR = "hftoolkit_space", "hftoolkit_objective"
# A trial found by a worker beyond --trials (two workers asked at once for the last one): stopped at once, not counted.
SURPLUS_ATTR = "hftoolkit_surplus"
CONNECT_TIMEOUT_S = 10


@dataclass(frozen=True)
class Objective:
    metric: str  # an eval metric, without the eval_ prefix
    direction: str  # maximize or minimize

    @property
    def text(self) -> str:
        return f"{self.metric}:{self.direction}"


def default_url(folder: Path) -> str:
    return f"sqlite:///{Path(folder).resolve() / STUDY_DB}"


def shown(url: str) -> str:
    """The URL as it may be printed: its password hidden (`USER:***@HOST`, base/secrets.py's rule). Not a URL at
    all: only what follows its last @, since nothing in it has a shape that says where a password is."""
    return redact(url) if "://" in url else url.rpartition("@")[2]


def driver_url(url: str) -> str:
    """`postgresql://` with the driver installed here: SQLAlchemy's default for it is psycopg2; hftoolkit[search]
    installs psycopg (3)."""
    import importlib.util

    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.drivername == "postgresql" and importlib.util.find_spec("psycopg2") is None \
            and importlib.util.find_spec("psycopg") is not None:
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def check_storage(url: str) -> str | None:
    """The problem with a --storage URL in one line (not a URL, no driver, the database not reachable), or None."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    where = f"--storage {shown(url)}"
    try:
        parsed = make_url(url)
    except ArgumentError:
        return f"{where}: not a database URL: expected for example postgresql://USER:PASSWORD@HOST:5432/DB"
    args = {"connect_timeout": CONNECT_TIMEOUT_S} if parsed.get_backend_name() in ("postgresql", "mysql") else {}
    try:
        engine = create_engine(driver_url(url), connect_args=args)
    except ModuleNotFoundError as err:
        from hftoolkit.base.extras import install_command

        return f"{where}: its driver ({err.name}) is not installed: {install_command('search')} (PostgreSQL), " \
               "or install the driver the URL names"
    except Exception as err:
        return f"{where}: not a usable database URL ({_first_line(err)})"
    try:
        with engine.connect():
            pass
    except Exception as err:
        reason = _first_line(getattr(err, "orig", None) or err)
        return f"{where}: the database can't be reached ({reason}): start it, or check the URL's host, port, " \
               "user, password and database"
    finally:
        engine.dispose()
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0].strip() if text else type(err).__name__


def stored_study(url: str, name: str):
    """The study `name` in the database, or None, read without writing anything (no table is created)."""
    import optuna
    from sqlalchemy import create_engine, inspect

    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        return None
    engine = create_engine(driver_url(url))
    try:
        if not inspect(engine).has_table("studies"):
            return None
    finally:
        engine.dispose()
    storage = optuna.storages.RDBStorage(driver_url(url), skip_table_creation=True)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


def mismatch(study, specs: dict[str, str], objective: Objective) -> list[str]:
    """How the stored study differs from this search (space, objective), one line each."""
    where = f"study {study.study_name}"
    stored = study.user_attrs.get(SPACE_ATTR)
    if stored is None:
        # A study with no trials yet may be one another worker has just made and not yet labelled (machines that
        # start together): it is joined, and open_study labels it and checks the label that stuck.
        if study.get_trials(deepcopy=False):
            return [f"{where}: not made by hftoolkit sweep --search: name another --study"]
        directions = [d.name.lower() for d in study.directions]
        if directions != [objective.direction]:
            return [f"--objective: {where} is to {' and '.join(directions)}, not {objective.direction}: pass an "
                    "objective of that direction, or name a new --study"]
        return []
    lines = []
    if stored != specs:
        keys = [k for k in dict.fromkeys([*stored, *specs]) if stored.get(k) != specs.get(k)]
        said = "; ".join(f"{k}: {stored.get(k, 'not searched')} there, {specs.get(k, 'not searched')} here"
                         for k in keys[:4])
        lines.append(f"--param: {where} searches another space ({said}): run it with the same --param values, or "
                     "name a new --study (or --output) for this space")
    if study.user_attrs.get(OBJECTIVE_ATTR) not in (None, objective.text):
        lines.append(f"--objective: {where} optimises {study.user_attrs[OBJECTIVE_ATTR]}, not {objective.text}: "
                     "pass the same objective, or name a new --study")
    return lines


def storage(url: str, heartbeat: int):
    """The RDBStorage the workers share, with the heartbeat that finds a killed worker's trial and the callback
    that enqueues it again."""
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    with quiet_optuna():
        return optuna.storages.RDBStorage(
            driver_url(url), heartbeat_interval=heartbeat, grace_period=3 * heartbeat,
            heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(),
            engine_kwargs={"pool_pre_ping": True})


@contextlib.contextmanager
def quiet_optuna():
    """Optuna's experimental-feature warnings (heartbeats) and its per-trial log lines: the search prints its own."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def sampler(name: str, space, seed: int | None, startup_trials: int | None):
    import optuna

    if name == "grid":
        return optuna.samplers.GridSampler(space.grid(), seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    extra = {} if startup_trials is None else {"n_startup_trials": startup_trials}
    return optuna.samplers.TPESampler(seed=seed, **extra)


def pruner(name: str, startup_trials: int | None):
    import optuna

    if name == "median":
        extra = {} if startup_trials is None else {"n_startup_trials": startup_trials}
        return optuna.pruners.MedianPruner(**extra)
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def open_study(url: str, name: str, space, objective: Objective, sampler_, pruner_, heartbeat: int):
    """Create the study (or join it, as another worker or machine does); its space and objective are stored with
    it, for the next worker to be held to."""
    import optuna

    with quiet_optuna():
        study = optuna.create_study(storage=_created(url, heartbeat), study_name=name, sampler=sampler_,
                                    pruner=pruner_, direction=objective.direction, load_if_exists=True)
        if SPACE_ATTR not in study.user_attrs:
            study.set_user_attr(SPACE_ATTR, space.specs())
            study.set_user_attr(OBJECTIVE_ATTR, objective.text)
        # Read back: a worker that labelled the study at the same moment with another space wins or loses here.
        problems = mismatch(study, space.specs(), objective)
    refuse(problems)
    return study


def _created(url: str, heartbeat: int, attempts: int = 5):
    """The storage, its tables created by whichever worker comes first: workers that start together on an empty
    PostgreSQL database race to create Optuna's tables, and the losers find them made once they try again."""
    import random
    import time

    from sqlalchemy.exc import DBAPIError

    for attempt in range(attempts):
        try:
            return storage(url, heartbeat)
        except DBAPIError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 + random.random())


def run_name(trial) -> str:
    """The run folder of a trial: the original's number for a retry, so that it resumes the killed one's folder."""
    number = trial.system_attrs.get("failed_trial", trial.number)
    return f"trial-{number:03d}"


def counted(trials) -> list:
    """The trials that count towards --trials: not those killed and enqueued again (their retry counts), and not
    a surplus one."""
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    return [t for t in trials if t.number not in retried and not t.user_attrs.get(SURPLUS_ATTR)]


def to_json(value) -> str:
    return json.dumps(value, sort_keys=True)


def refuse(lines: list[str]) -> None:
    if lines:
        from hftoolkit.config.recipe import RecipeError

        raise RecipeError(lines) if len(lines) > 1 else UserError(lines[0])
