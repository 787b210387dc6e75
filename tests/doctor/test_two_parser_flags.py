"""timm's train.py reads its command line with two parsers: a `--config`-only parser's
parse_known_args first, then the parser of its ~170 training options on the rest. The doctor
kept the first parse only, so every finding and every tune knob saw one flag, `--config`, and
the compile advice read `model = torch.compile(model)` beside timm's own `--torchcompile`."""

from __future__ import annotations

import textwrap

import pytest

from doctor_helpers import observations
from trainspeed.doctor.checks.script_flags import set_flag, show_flag
from trainspeed.tune.script_facts import read_facts
from trainspeed.tune.script_session import flag_styles

pytestmark = pytest.mark.timeout(120)

SCRIPT = textwrap.dedent('''
    import argparse
    import torch
    from torch import nn

    config_parser = argparse.ArgumentParser(add_help=False)
    config_parser.add_argument("-c", "--config", default="")
    parser = argparse.ArgumentParser()
    parser.add_argument("-b", "--batch-size", type=int, default=128)
    parser.add_argument("-j", "--workers", type=int, default=4)
    parser.add_argument("--log-interval", type=int, default=50)
    parser.add_argument("--torchcompile", nargs="?", type=str, default=None, const="inductor")
    args_config, remaining = config_parser.parse_known_args()
    args = parser.parse_args(remaining)
    model = nn.Linear(8, 2)
    if args.torchcompile:
        model = torch.compile(model, backend=args.torchcompile)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(40):
        loss = model(torch.randn(args.batch_size, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
''')


def test_both_parsers_flags_are_the_scripts_and_an_optional_value_flag_is_set_bare(tmp_path, monkeypatch):
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    result = run_doctor(DoctorConfig(command=["python", "train.py", "-b", "8", "--log-interval", "5"], steps=20,
                                     out=tmp_path / "run", system_sampler=False))
    (flags,) = observations(result, "script_flags")
    by_option = {f["option"]: f for f in flags["flags"]}
    assert set(by_option) == {"--batch-size", "--workers", "--log-interval", "--torchcompile", "--config"}
    assert by_option["--batch-size"]["value"] == 8 and by_option["--log-interval"]["value"] == 5
    compile_flag = by_option["--torchcompile"]
    assert compile_flag["bare_value"] == "inductor" and compile_flag["value"] is None
    assert show_flag(compile_flag) == "--torchcompile (off)" and set_flag(compile_flag, True) == "--torchcompile"
    facts = read_facts(result.run_dir)
    assert flag_styles(facts)["--torchcompile"] == "bare"  # the tune's compile trial passes it alone
    not_compiled = next(f for f in result.findings if f["id"] == "not_compiled")
    assert not_compiled["recommendation"].startswith("--torchcompile (the script's flag, now --torchcompile (off))")
