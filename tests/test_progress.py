"""Progress bars: redrawn in place on a terminal, a few lines in a log (:mod:`fedgat.progress`)."""

import io

import pytest

from fedgat import cli
from fedgat.cli_engine import SYNTHETIC_NODES, synthetic_sizes
from fedgat.progress import LOG_INTERVAL_S, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def states(text: str) -> list[str]:
    """The bar states written: tqdm separates redraws with ``\\r`` (and ends with a newline)."""
    return [s for s in text.replace("\n", "\r").split("\r") if s.strip()]


def drive(stream: io.StringIO, steps: int = 500) -> None:
    with progress_bar("work", total=steps, unit="step", file=stream) as bar:
        for i in range(steps):
            bar.set_postfix(i=i, refresh=False)
            bar.update(1)


def test_a_bar_in_a_log_writes_its_first_and_last_state_only():
    log = io.StringIO()
    drive(log)
    written = states(log.getvalue())
    assert written[0].startswith("work:   0%") and "500/500" in written[-1]
    assert len(written) <= 3, written  # tqdm's own pace (0.1 s) would write a state per redraw


def test_a_bar_on_a_terminal_keeps_tqdms_pace():
    tty, log = Terminal(), io.StringIO()
    assert progress_bar("x", file=tty).mininterval == pytest.approx(0.1)
    assert progress_bar("x", file=log).mininterval == LOG_INTERVAL_S
    assert progress_bar("x", file=log, mininterval=1.0).mininterval == 1.0  # the caller's option wins
    assert progress_bar("x", enabled=False, file=log).disable


def test_demo_bars_appear_with_their_phase_and_total(capsys):
    """Each phase's bar is drawn once its total is known: no counters without a total waiting through the
    phases before them, each bar reaches 100%, and in a captured (non-terminal) stderr the whole demo's
    progress is a few dozen states, not one per row."""
    argv = ["demo", "--dataset", "synthetic", "--nodes", "120", "--clients", "3", "--rounds", "3"]
    assert cli.main(argv) == 0
    written = states(capsys.readouterr().err)
    bars = [s for s in written if "%|" in s or "row [" in s or "node [" in s]
    for phase in ("encrypt + upload", "server compute (HE)", "download + decrypt", "training rounds"):
        mine = [s for s in bars if phase in s]
        assert mine and "100%" in mine[-1], (phase, mine)
        assert all("%|" in s for s in mine), mine  # always a bar with its total, never a bare counter
    assert len(bars) <= 20, bars


class Loaded(Exception):
    pass


def test_demo_train_and_audit_build_one_synthetic_graph(monkeypatch):
    """``--dataset synthetic`` without ``--nodes`` is the same graph in every command (train used the
    generator's own split, 200 testing nodes instead of the demo's 100), and ``--no-progress`` is
    ``--quiet`` in each of them (``fedgat bench`` takes both spellings too)."""
    import fedgat.data

    asked = {}

    def load_dataset(name, **kwargs):
        asked[command] = kwargs
        raise Loaded

    monkeypatch.setattr(fedgat.data, "load_dataset", load_dataset)
    for command in ("demo", "train", "audit"):
        with pytest.raises(Loaded):
            cli.main([command, "--dataset", "synthetic", "--debug"])
    assert (
        asked["demo"] == asked["train"] == asked["audit"] == {"seed": 0, **synthetic_sizes(SYNTHETIC_NODES)}
    )
    # the seed seeds the graph too: demo's and audit's --seed, train's --first-seed
    for command, flag in (("demo", "--seed"), ("train", "--first-seed"), ("audit", "--seed")):
        with pytest.raises(Loaded):
            cli.main([command, "--dataset", "synthetic", flag, "3", "--debug"])
        assert asked[command] == {"seed": 3, **synthetic_sizes(SYNTHETIC_NODES)}
    parser = cli.build_parser()
    for command in ("demo", "train", "audit"):
        assert parser.parse_args([command, "--no-progress"]).quiet
    assert not parser.parse_args(["bench", "overhead", "--quiet"]).progress
