"""The Paddle static-graph, fluid and retired-API rules, one behaviour per test (conversion only: no paddle import)."""

from __future__ import annotations

import textwrap

from rule_testing import assert_unchanged, convert_text, findings_of

from dpmigrate.codemod.engine import convert
from dpmigrate.findings import Options

STATIC_HEAD = """\
import numpy as np
import paddle

paddle.enable_static()
x = paddle.static.data(name="x", shape=[None, 4], dtype="float32")
loss = paddle.mean(paddle.static.nn.fc(x, size=1))
"""
FLUID_HEAD = """\
import paddle.fluid as fluid

x = fluid.layers.data(name="x", shape=[4], dtype="float32")
cost = fluid.layers.mean(fluid.layers.fc(input=x, size=1))
"""


def _output(source: str, **options) -> str:
    return convert_text(source, **options).output.decode()


# --- static graph (Paddle 2.x/3.x) ------------------------------------------------------------------


def test_only_the_optimizer_that_minimizes_is_wrapped_and_a_scripts_own_sgd_is_not():
    source = STATIC_HEAD + textwrap.dedent("""\
        class SGD:
            def minimize(self, loss):
                pass
        spare = paddle.optimizer.Adam(learning_rate=0.1)
        mine = SGD()
        mine.minimize(loss)
        opt = paddle.optimizer.SGD(learning_rate=0.1)
        opt.minimize(loss)
    """)
    out = _output(source)
    assert "opt = dp.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.1))" in out
    assert "spare = paddle.optimizer.Adam(learning_rate=0.1)" in out
    assert "mine = SGD()" in out


def test_an_inline_optimizer_is_wrapped_where_it_is_built():
    out = _output(STATIC_HEAD + "paddle.optimizer.SGD(learning_rate=0.1).minimize(loss)\n")
    assert "dp.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.1)).minimize(loss)" in out


def test_dygraph_minimize_is_not_a_static_rules_business():
    source = textwrap.dedent("""\
        import paddle
        model = paddle.nn.Linear(4, 1)
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        loss = model(paddle.randn([8, 4])).mean()
        loss.backward()
        opt.minimize(loss)
    """)
    result = convert_text(source)
    assert not [f for f in result.findings if f.rule.startswith(("static-", "fluid-"))]


def test_cuda_place_becomes_this_ranks_card_and_cpu_place_stays():
    out = _output(STATIC_HEAD + "opt = paddle.optimizer.SGD(0.1)\nopt.minimize(loss)\n"
                  "gpu = paddle.static.Executor(paddle.CUDAPlace(0))\ncpu = paddle.static.Executor(paddle.CPUPlace())\n")
    assert "gpu = paddle.static.Executor(paddle.set_device(dp.device()))" in out
    assert "cpu = paddle.static.Executor(paddle.CPUPlace())" in out


def _training_loop(feed: str) -> str:
    return STATIC_HEAD + textwrap.dedent(f"""\
        opt = paddle.optimizer.SGD(0.1)
        opt.minimize(loss)
        test_program = paddle.static.default_main_program().clone()
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(paddle.static.default_startup_program())
        for xb in batches:
            exe.run(feed={feed}, fetch_list=[loss])
            exe.run(test_program, feed={{"x": xb}}, fetch_list=[loss])
    """)


def test_global_batch_shards_what_the_training_program_is_fed_and_not_the_evaluation():
    out = _output(_training_loop('{"x": xb}'), batch="global")
    assert 'exe.run(feed={"x": dp.shard(xb)}, fetch_list=[loss])' in out
    assert 'exe.run(test_program, feed={"x": xb}, fetch_list=[loss])' in out
    assert "exe.run(paddle.static.default_startup_program())" in out


def test_per_device_batch_feeds_whole_batches_and_says_there_is_no_speed_up():
    result = convert_text(_training_loop('{"x": xb}'))
    assert 'exe.run(feed={"x": xb}, fetch_list=[loss])' in result.output.decode()
    [note] = findings_of(result, "static-feed-shard", "note")
    assert "no faster" in note.message and "--batch global" in note.fix


def test_a_feed_built_elsewhere_is_declined_with_the_fix():
    result = convert_text(_training_loop("make_feed(xb)"), batch="global")
    assert "exe.run(feed=make_feed(xb), fetch_list=[loss])" in result.output.decode()
    [declined] = findings_of(result, "static-feed-shard", "declined")
    assert "dp.shard(value)" in declined.fix


def test_static_saves_run_on_the_main_process_then_every_rank_meets():
    out = _output(STATIC_HEAD + "opt = paddle.optimizer.SGD(0.1)\nopt.minimize(loss)\n"
                  "for epoch in range(2):\n    paddle.static.save(paddle.static.default_main_program(), 'ck')\n")
    assert out.endswith("for epoch in range(2):\n    if dp.is_main_process():\n"
                        "        paddle.static.save(paddle.static.default_main_program(), 'ck')\n    dp.barrier()\n")


def test_an_inference_model_gets_the_pir_format_note_and_a_rank_guarded_save_is_left_alone():
    source = STATIC_HEAD + "opt = paddle.optimizer.SGD(0.1)\nopt.minimize(loss)\nrank = 0\n" \
        "if rank == 0:\n    paddle.static.save_inference_model('m', [x], [loss], exe)\n"
    result = convert_text(source)
    assert "if rank == 0:\n    paddle.static.save_inference_model('m', [x], [loss], exe)\n" in result.output.decode()
    notes = [f.message for f in findings_of(result, "static-save", "note")]
    assert any(".json and .pdiparams" in n for n in notes) and any("already under a rank condition" in n for n in notes)


def test_clone_for_test_is_reported_as_failing_under_pir():
    result = convert_text(STATIC_HEAD + "test_program = paddle.static.default_main_program().clone(for_test=True)\n"
                          "opt = paddle.optimizer.SGD(0.1)\nopt.minimize(loss)\n")
    [note] = findings_of(result, "static-pir", "note")
    assert "TypeError under PIR" in note.message


def test_training_run_under_a_rank_condition_is_an_error_even_in_a_converted_file():
    source = textwrap.dedent("""\
        import paddle
        import dpmigrate.runtime.paddle as dp
        paddle.enable_static()
        exe = paddle.static.Executor(dp.device())
        exe.run(paddle.static.default_startup_program())
        if dp.is_main_process():
            exe.run(paddle.static.default_main_program(), feed=feed, fetch_list=[loss])
            exe.run(paddle.static.default_startup_program())
    """)
    result = assert_unchanged(source)
    [error] = findings_of(result, "static-rank-divergence", "error")
    assert error.line == 7 and "if dp.is_main_process():" in error.message


# --- legacy fluid 1.x ---------------------------------------------------------------------------------


def test_fluid_inline_place_explicit_main_program_and_inline_optimizer():
    source = FLUID_HEAD + textwrap.dedent("""\
        fluid.optimizer.SGD(learning_rate=0.01).minimize(cost)
        exe = fluid.Executor(fluid.CUDAPlace(0))
        exe.run(fluid.default_startup_program())
        for i in range(10):
            exe.run(fluid.default_main_program(), feed=feed(), fetch_list=[cost])
    """)
    out = _output(source)
    assert "fleet.distributed_optimizer(fluid.optimizer.SGD(learning_rate=0.01), strategy=dist_strategy)" \
        ".minimize(cost, fluid.default_startup_program())" in out
    assert 'exe = fluid.Executor(fluid.CUDAPlace(int(os.getenv("FLAGS_selected_gpus", "0"))))' in out
    assert "exe.run(train_prog, feed=feed(), fetch_list=[cost])" in out
    assert out.startswith("import paddle.fluid as fluid\nimport os\nfrom paddle.fluid.incubate.fleet.collective")
    assert "dp." not in out and "dpmigrate" not in out  # fluid output uses Fleet, not the runtime


def test_fluid_runs_in_another_function_use_fleet_main_program_directly():
    source = FLUID_HEAD + textwrap.dedent("""\
        optimizer = fluid.optimizer.SGD(learning_rate=0.01)
        optimizer.minimize(cost)
        exe = fluid.Executor(fluid.CPUPlace())
        def train():
            for i in range(10):
                exe.run(feed=feed(), fetch_list=[cost])
        train()
    """)
    out = _output(source)
    assert "exe.run(program=fleet.main_program, feed=feed(), fetch_list=[cost])" in out
    assert "train_prog" not in out


def test_fluid_dygraph_single_card_script_is_declined_unchanged():
    source = textwrap.dedent("""\
        import paddle.fluid as fluid
        with fluid.dygraph.guard():
            model = fluid.dygraph.Linear(4, 1)
            opt = fluid.optimizer.SGD(learning_rate=0.1, parameter_list=model.parameters())
            loss = fluid.layers.mean(model(fluid.dygraph.to_variable(data)))
            loss.backward()
            opt.minimize(loss)
    """)
    result = assert_unchanged(source)
    [declined] = findings_of(result, "fluid-fleet", "declined")
    assert "paddle.distributed" not in declined.message and "Paddle 2.x dygraph" in declined.fix


def test_fluid_with_two_optimizers_is_declined_unchanged():
    assert findings_of(assert_unchanged(FLUID_HEAD + "a = fluid.optimizer.SGD(0.1)\na.minimize(cost)\n"
                                        "b = fluid.optimizer.SGD(0.1)\nb.minimize(cost)\n"), "fluid-fleet", "declined")


def test_fluid_strategy_set_after_minimize_is_declined_unchanged_rather_than_lost():
    source = FLUID_HEAD + textwrap.dedent("""\
        optimizer = fluid.optimizer.SGD(learning_rate=0.01)
        optimizer.minimize(cost)
        build = fluid.BuildStrategy()
        build.fuse_all_reduce_ops = True
        exe = fluid.Executor(fluid.CUDAPlace(0))
        compiled = fluid.CompiledProgram(fluid.default_main_program()).with_data_parallel(
            loss_name=cost.name, build_strategy=build)
        exe.run(compiled, feed=feed(), fetch_list=[cost])
    """)
    [declined] = findings_of(assert_unchanged(source), "fluid-fleet", "declined")
    assert "after optimizer.minimize" in declined.message and "before optimizer.minimize" in declined.fix


def test_fleet_training_run_under_worker_index_condition_is_an_error():
    source = textwrap.dedent("""\
        import paddle.fluid as fluid
        from paddle.fluid.incubate.fleet.collective import fleet
        exe = fluid.Executor(fluid.CUDAPlace(0))
        train_prog = fleet.main_program
        if fleet.worker_index() == 0:
            exe.run(program=train_prog, feed=feed, fetch_list=[cost])
    """)
    [error] = findings_of(assert_unchanged(source), "static-rank-divergence", "error")
    assert "fleet.worker_index() == 0" in error.message


# --- retired multi-card APIs ------------------------------------------------------------------------


def test_parallel_executor_is_reported_with_the_modern_replacement_and_left_unchanged():
    source = FLUID_HEAD + "pe = fluid.ParallelExecutor(use_cuda=True, loss_name=cost.name)\n"
    [declined] = findings_of(assert_unchanged(source), "legacy-parallel", "declined")
    assert "one process per card" in declined.fix


def test_the_fluid_generation_is_left_to_the_rules_that_name_it():
    """No common rule (dp.init, dp.print...) touches a fluid file: the runtime cannot run where fluid does."""
    source = FLUID_HEAD + "optimizer = fluid.optimizer.SGD(0.1)\noptimizer.minimize(cost)\nprint('built')\n"
    result = convert(source.encode(), "train.py", Options())
    assert result.generation == "fluid"
    assert {f.rule for f in result.findings} == {"fluid-fleet"}
    assert "print('built')" in result.output.decode()


def test_the_seeds_tuning_knobs_end_up_in_the_strategy_fleet_minimizes_with():
    """fluid_tuned: every knob set on the BuildStrategy stays on it, it becomes the DistributedStrategy, the
    ExecutionStrategy (threads, scope drops) is attached to it, and both happen before minimize."""
    from fixture_cases import FIXTURES, run

    case = FIXTURES / "paddle" / "fluid_tuned"
    before = (case / "before.py").read_text()
    lines = run(case).output.decode().splitlines()
    knobs = [line for line in before.splitlines() if line.startswith(("build_strategy.", "exec_strategy."))]
    assert {k.split("=")[0].split(".")[1].strip() for k in knobs} == {
        "fuse_all_reduce_ops", "nccl_comm_num", "use_hierarchical_allreduce", "num_threads",
        "num_iteration_per_drop_scope"}
    minimize = lines.index("optimizer.minimize(loss, fluid.default_startup_program())")
    for line in [*knobs, "build_strategy = DistributedStrategy()", "build_strategy.exec_strategy = exec_strategy",
                 "fleet.init(role)", "optimizer = fleet.distributed_optimizer(optimizer, strategy=build_strategy)"]:
        assert lines.index(line) < minimize, line
    assert "train_program = fleet.main_program" in lines
    assert "    if step % fetch_frequency == 0:" in lines  # the fetch frequency is the loop's own, kept


def test_a_paddle_2_static_script_using_fluid_pieces_is_static_graph_and_goes_onto_the_runtime():
    source = textwrap.dedent("""\
        import paddle
        import paddle.fluid as fluid
        paddle.enable_static()
        x = fluid.data(name="x", shape=[None, 4], dtype="float32")
        loss = fluid.layers.mean(fluid.layers.fc(input=x, size=1))
        optimizer = fluid.optimizer.SGD(learning_rate=0.1)
        optimizer.minimize(loss)
        exe = fluid.Executor(fluid.CPUPlace())
        exe.run(fluid.default_startup_program())
        fluid.io.save_persistables(exe, "checkpoint")
    """)
    result = convert_text(source)
    out = result.output.decode()
    assert result.generation == "static"
    assert "optimizer = dp.distributed_optimizer(fluid.optimizer.SGD(learning_rate=0.1))" in out
    assert out.endswith('if dp.is_main_process():\n    fluid.io.save_persistables(exe, "checkpoint")\ndp.barrier()\n')
    assert "fleet" not in out


def test_a_feed_dict_that_unpacks_another_is_declined_not_half_sharded():
    result = convert_text(_training_loop('{**extra, "x": xb}'), batch="global")
    assert 'exe.run(feed={**extra, "x": xb}, fetch_list=[loss])' in result.output.decode()
    assert findings_of(result, "static-feed-shard", "declined")


def test_fluid_minimize_with_a_keyword_loss_gets_the_startup_program_by_keyword():
    out = _output(FLUID_HEAD + "opt = fluid.optimizer.Adam(0.1)\nopt.minimize(loss=cost)\n")
    assert "opt.minimize(loss=cost, startup_program=fluid.default_startup_program())" in out


def test_fluid_conversion_inside_a_function_leaves_no_trailing_whitespace():
    out = _output(FLUID_HEAD + "def build():\n    opt = fluid.optimizer.Adam(0.1)\n    opt.minimize(cost)\nbuild()\n")
    assert "    fleet.init(role)\n\n    opt = fleet.distributed_optimizer(opt, strategy=dist_strategy)\n" in out


def test_programs_built_under_program_guard_are_known_as_training_and_startup_programs():
    source = textwrap.dedent("""\
        import paddle
        paddle.enable_static()
        main_program = paddle.static.Program()
        startup_program = paddle.static.Program()
        with paddle.static.program_guard(main_program, startup_program):
            x = paddle.static.data(name="x", shape=[None, 4], dtype="float32")
            loss = paddle.mean(paddle.static.nn.fc(x, size=1))
            test_program = main_program.clone()
            paddle.optimizer.SGD(learning_rate=0.1).minimize(loss)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup_program)
        for xb in batches:
            exe.run(main_program, feed={"x": xb}, fetch_list=[loss])
            exe.run(test_program, feed={"x": xb}, fetch_list=[loss])
    """)
    result = convert_text(source + 'if paddle.distributed.get_rank() == 0:\n    exe.run(main_program, feed={"x": xb})\n',
                          batch="global")
    assert result.left_alone  # it uses paddle.distributed by hand: left unchanged, only checked
    [error] = findings_of(result, "static-rank-divergence", "error")
    assert error.line == 16
    out = _output(source, batch="global")
    assert 'exe.run(main_program, feed={"x": dp.shard(xb)}, fetch_list=[loss])' in out
    assert 'exe.run(test_program, feed={"x": xb}, fetch_list=[loss])' in out
    assert "exe.run(startup_program)\n" in out
