import logging

from qcls import progress


def test_a_warning_prints_one_line_when_the_program_configured_no_logging(monkeypatch, capsys):
    monkeypatch.setattr(progress, "_quiet", False)
    monkeypatch.setattr(progress.log, "propagate", False)  # no handler up the chain: logging is unconfigured
    monkeypatch.setattr(progress.log, "handlers", [])
    progress.warn("the forward runs eagerly")
    assert capsys.readouterr().err == "[qcls] WARNING: the forward runs eagerly\n"


def test_a_warning_goes_through_logging_alone_where_the_program_configured_it(capsys, caplog):
    with caplog.at_level(logging.WARNING, logger=progress.log.name):
        progress.warn("the forward runs eagerly")
    assert [r.getMessage() for r in caplog.records] == ["the forward runs eagerly"]
    assert "the forward runs eagerly" not in capsys.readouterr().err


def test_a_note_is_not_labelled_a_warning(monkeypatch, capsys):
    monkeypatch.setattr(progress, "_quiet", False)
    progress.step_note("int8: 7 of 7 decoder linears in W8A8")
    assert capsys.readouterr().err == "[qcls] int8: 7 of 7 decoder linears in W8A8\n"
