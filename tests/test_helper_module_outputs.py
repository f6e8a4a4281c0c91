"""A helper module's writers and loggers act once, like the script's own (issue 19 audit: image_classification_paddle).

Its ``utils`` set up a ``logging`` file handler and wrote the history with ``json.dump``: launched on 2 ranks, the
log had every line twice and the JSON came from whichever rank wrote last, while the same code in the script was
made rank-aware. Converted with the script, the helper's file writes run on the main process, and a script logging
only through a helper's logger gets the main-process logging switch after ``dp.init()``.
"""

from __future__ import annotations

import textwrap

from dpmigrate.cli import main

HELPERS = """
    import json
    import logging
    import os

    import paddle


    def get_logger(name, log_file):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(logging.FileHandler(log_file))
        return logger


    def write_json(obj, path):
        with open(path, "w") as f:
            json.dump(obj, f)
    """
TRAIN = """
    import paddle
    from myutils import get_logger, write_json

    logger = get_logger("train", "run.log")
    loader = paddle.io.DataLoader(DATA, batch_size=16, shuffle=True)
    net = paddle.nn.Linear(8, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
    history = []
    for xb, yb in loader:
        loss = paddle.nn.functional.mse_loss(net(xb), yb)
        loss.backward()
        opt.step()
        opt.clear_grad()
        logger.info("loss %f", float(loss))
        history.append(float(loss))
    write_json(history, "history.json")
    """


def test_a_helper_modules_file_writes_and_logger_act_on_the_main_process(tmp_path, capsys):
    (tmp_path / "myutils.py").write_text(textwrap.dedent(HELPERS).lstrip())
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN).lstrip())
    main([str(script)])
    err = capsys.readouterr().err
    out = script.read_text()
    assert ("dp.init()\nif not dp.is_main_process():\n    import logging\n    logging.disable(logging.WARNING)\n"
            'logger = get_logger("train", "run.log")') in out, out
    assert "train.py:2:1: change main-process-logging: logging: the local module `myutils` logs" in err, err
    helpers = (tmp_path / "myutils.py").read_text()
    assert '    if dp.is_main_process():\n        with open(path, "w") as f:\n            json.dump(obj, f)' in helpers, helpers
    assert "myutils.py:16:10: change main-process-output: file written by the main process only" in err, err
    main([str(script)])  # a second run changes nothing
    assert script.read_text() == out and (tmp_path / "myutils.py").read_text() == helpers


def test_a_script_whose_local_modules_do_not_log_gets_no_switch(tmp_path, capsys):
    (tmp_path / "myutils.py").write_text(textwrap.dedent(HELPERS).lstrip().replace("import logging\n", "")
                                         .replace("logging.", "print and None or __import__('logging')."))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN).lstrip())
    main(["--check", str(script)])
    assert "main-process-logging" not in capsys.readouterr().err
