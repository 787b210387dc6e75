"""The step model on the loops people write (CPU, small real loops under the doctor): a GAN's
two optimizers, actor-critic, a no-grad teacher, several loss terms, per-sample nn.Module
transforms inside the dataset. Each loop's update structure is known; the doctor's reading
of it (micro-batches per update, which module is the model, which time is data) is checked."""
from __future__ import annotations

import textwrap

import pytest

from doctor_helpers import ids, observations, run_inline

pytestmark = pytest.mark.timeout(120)

PRELUDE = """
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
torch.manual_seed(0)
"""

GAN = """
netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
netD = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4)
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4)
criterion = nn.BCEWithLogitsLoss()
loader = DataLoader(TensorDataset(torch.randn(4096, 8)), batch_size=16)
for epoch in range(100):
    for (real,) in loader:
        # (1) update D: two backward passes (real, fake), one step
        netD.zero_grad()
        errD_real = criterion(netD(real), torch.ones(16, 1))
        errD_real.backward()
        fake = netG(torch.randn(16, 4))
        errD_fake = criterion(netD(fake.detach()), torch.zeros(16, 1))
        errD_fake.backward()
        optimizerD.step()
        # (2) update G: one backward pass, one step
        netG.zero_grad()
        errG = criterion(netD(fake), torch.ones(16, 1))
        errG.backward()
        optimizerG.step()
"""


@pytest.fixture
def doctor_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return lambda body, steps=20: run_inline(tmp_path, PRELUDE + textwrap.dedent(body), steps)


_observations = observations


def test_a_gan_is_two_updates_of_one_batch_not_accumulation(doctor_code):
    result = doctor_code(GAN)
    acc = _observations(result, "accumulation")[0]
    assert acc["factor"] == 1, acc
    assert "accumulation_for_speed" not in ids(result)
    opts = {o["name"]: o for o in _observations(result, "optimizer")}
    assert set(opts) == {"optimizerD", "optimizerG"}
    assert opts["optimizerD"]["updates"] == ["Sequential"] and opts["optimizerD"]["micro_batches"] == 1
    assert opts["optimizerG"]["micro_batches"] == 1
    assert result.steps == 20


def test_a_gans_models_are_both_targets_of_mixed_precision(doctor_code):
    """The tune's facts name every trained model's class, the biggest (the trained module's)
    first: bf16 must cover the generator and the discriminator (tests/patches/test_several_models.py)."""
    from trainspeed.tune.script_facts import read_facts

    named = ("class Generator(nn.Sequential):\n    pass\n\n\nclass Discriminator(nn.Sequential):\n    pass\n\n\n"
             + GAN.replace("netG = nn.Sequential(nn.Linear(4, 16)", "netG = Generator(nn.Linear(4, 32)")
             .replace("nn.Linear(16, 8))", "nn.Linear(32, 8))").replace("netD = nn.Sequential(", "netD = Discriminator("))
    result = doctor_code(named)
    targets = read_facts(result.run_dir).targets
    assert targets.model_class == "Generator" and targets.trained_classes == ("Generator", "Discriminator")
    compile_ = next(f for f in result.findings if f["id"] == "not_compiled")  # both, as the tune compiles them
    assert compile_["recommendation"].startswith("compile each trained model in place where it is built "
                                                 "(Discriminator, Generator)"), compile_
    # fused/foreach goes to both optimizers, the primary's (the first to step) first
    built = [open(path).read().splitlines()[line - 1].split("=")[0].strip() for path, line in targets.optimizer_sites]
    assert built == ["optimizerD", "optimizerG"] and targets.optimizer_sites[0] == targets.optimizer_site


def test_a_generator_of_transposed_convolutions_is_convolutional(doctor_code):
    """dcgan's Generator is ConvTranspose2d layers only: channels_last applies to it (and
    cuDNN's autotuner), but the doctor counted Conv2d alone."""
    result = doctor_code("""
        net = nn.Sequential(nn.ConvTranspose2d(8, 4, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(4, 3, 4, 2, 1))
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for step in range(30):
            loss = net(torch.randn(4, 8, 4, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    (model,) = _observations(result, "model")
    assert model["convolutional"] is True


def test_a_gan_without_a_loader_is_not_accumulation_either(doctor_code):
    result = doctor_code(GAN.replace("for (real,) in loader:", "for real in [torch.randn(16, 8)] * 64:"))
    acc = _observations(result, "accumulation")[0]
    assert acc["factor"] == 1, acc
    assert "accumulation_for_speed" not in ids(result)


def test_accumulation_is_still_found_per_optimizer(doctor_code):
    result = doctor_code("""
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1)), batch_size=4)
        for epoch in range(10):
            for i, (x, y) in enumerate(loader):
                (nn.functional.mse_loss(model(x), y) / 3).backward()
                if i % 3 == 2:
                    opt.step(); opt.zero_grad()
    """)
    assert _observations(result, "accumulation")[0]["factor"] == 3
    finding = next(f for f in result.findings if f["id"] == "accumulation_for_speed")
    assert "opt (SGD over Sequential)" in finding["evidence"]



def test_a_teacher_no_optimizer_updates_leaves_accumulation_found(doctor_code):
    """Other models' unread outputs are subtracted from an update's new inputs (a GAN's fake
    batch through a function); a teacher that runs with gradients on but that no optimizer
    updates is no such model: its outputs go to the loss, the student's 3 micro-batches stay 3."""
    result = doctor_code("""
        teacher, student = nn.Linear(8, 4), nn.Linear(8, 4)
        opt = torch.optim.SGD(student.parameters(), lr=0.01)
        for step in range(200):
            x = torch.randn(4, 8)
            (nn.functional.mse_loss(student(x), teacher(x)) / 3).backward()
            if step % 3 == 2:
                opt.step(); opt.zero_grad()
    """)
    assert _observations(result, "accumulation")[0]["factor"] == 3
def test_actor_critic_and_several_loss_terms_are_one_micro_batch(doctor_code):
    result = doctor_code("""
        actor = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
        critic = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        opt = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=1e-3)
        for step in range(1000):
            state = torch.randn(32, 8)
            logp = torch.log_softmax(actor(state), -1)[:, 0]
            value = critic(state).squeeze(-1)
            ret = torch.randn(32)
            policy_loss = -(logp * (ret - value.detach())).mean()
            value_loss = (ret - value).pow(2).mean()
            opt.zero_grad()
            policy_loss.backward()
            value_loss.backward()
            opt.step()
    """)
    acc = _observations(result, "accumulation")[0]
    assert acc["factor"] == 1, acc
    assert "accumulation_for_speed" not in ids(result)
    (opt,) = _observations(result, "optimizer")
    assert opt["updates"] == ["Sequential", "Sequential"]


def test_a_no_grad_teacher_inside_the_step_is_forward_not_evaluation(doctor_code):
    result = doctor_code("""
        import copy, time
        class Teacher(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = nn.Linear(8, 4)
            def forward(self, x):
                time.sleep(0.003)  # a big frozen model
                return self.net(x)
        teacher = Teacher().eval()
        student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        ema = copy.deepcopy(student)
        opt = torch.optim.SGD(student.parameters(), lr=0.01)
        loader = DataLoader(TensorDataset(torch.randn(4096, 8)), batch_size=32)
        for epoch in range(10):
            for (x,) in loader:
                with torch.no_grad():
                    target = teacher(x)
                loss = nn.functional.mse_loss(student(x), target)
                opt.zero_grad(); loss.backward(); opt.step()
                with torch.no_grad():
                    for pe, ps in zip(ema.parameters(), student.parameters()):
                        pe.mul_(0.99).add_(ps, alpha=0.01)
    """)
    assert "evaluation_share" not in ids(result)
    assert result.summary["phases"]["eval"]["share"] < 0.05
    assert result.summary["phases"]["forward"]["share"] > 0.3
    models = _observations(result, "model")
    trained = [m for m in models if m.get("trained_by")]
    assert [m["params"] for m in trained] == [sum(p.numel() for p in __import__("torch").nn.Sequential(
        __import__("torch").nn.Linear(8, 16), __import__("torch").nn.Linear(16, 4)).parameters())]


TRANSFORM_DATASET = """
import time
class Jitter(nn.Module):  # a torchvision-v2-style transform: an nn.Module without parameters
    def forward(self, img):
        time.sleep(0.004)
        return img + 0.01 * torch.randn_like(img)

class Flip(nn.Module):
    def forward(self, img):
        return img.flip(-1)

class Images(Dataset):
    def __init__(self):
        self.data = torch.randn(512, 3, 8, 8)
        self.transform = nn.Sequential(Flip(), Jitter())
    def __len__(self):
        return len(self.data)
    def __getitem__(self, i):
        return self.transform(self.data[i]), i % 10

model = nn.Sequential(nn.Flatten(), nn.Linear(192, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Images(), batch_size=4, num_workers=0)
for epoch in range(100):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
"""


def test_per_sample_module_transforms_are_data_time_and_not_the_model(doctor_code):
    result = doctor_code(TRANSFORM_DATASET)
    phases = result.summary["phases"]
    assert phases["data"]["share"] > 0.6, phases
    assert phases["forward"]["share"] < 0.2, phases
    classes = [m["class"] for m in _observations(result, "model")]
    assert classes == ["Sequential"], classes
    assert result.findings[0]["id"] == "data_bound" or "data_bound" in ids(result)[:2]
    not_compiled = next((f for f in result.findings if f["id"] == "not_compiled"), None)
    assert not_compiled is None or "Flip" not in not_compiled["evidence"]


def test_an_augmentation_module_in_the_loop_is_data_and_never_the_model(doctor_code):
    # an image library's train script: "The model is not compiled — evidence:
    # RandomHorizontalFlip runs eagerly"; the flip was the first module the loop called
    result = doctor_code("""
        import time
        class RandomHorizontalFlip(nn.Module):
            def forward(self, x):
                time.sleep(0.003)
                return x.flip(-1)
        flip = RandomHorizontalFlip()
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        for step in range(100):
            out = model(flip(x))
            loss = nn.functional.mse_loss(out, y)
            opt.zero_grad(); loss.backward(); opt.step()
    """)
    assert [m["class"] for m in _observations(result, "model")] == ["Sequential"]
    not_compiled = next(f for f in result.findings if f["id"] == "not_compiled")
    assert not_compiled["evidence"].startswith("Sequential runs eagerly")
    phases = result.summary["phases"]
    assert phases["data"]["share"] > phases["forward"]["share"], phases


def test_the_trained_model_under_no_grad_inside_a_step_is_still_evaluation(doctor_code):
    # evaluation at the top of the loop body, after the training batch was fetched
    result = doctor_code("""
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1)), batch_size=8)
        val = torch.randn(512, 8)
        for epoch in range(10):
            for i, (x, y) in enumerate(loader):
                if i % 2 == 0:
                    model.eval()
                    with torch.no_grad():
                        for _ in range(20):
                            model(val)
                    model.train()
                loss = nn.functional.mse_loss(model(x), y)
                opt.zero_grad(); loss.backward(); opt.step()
    """)
    phases = result.summary["phases"]
    assert phases["eval"]["share"] > phases["forward"]["share"], phases


MANUAL = """
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
x, y = torch.randn(32, 8), torch.randn(32, 1)
for step in range(1000):
    {body}
"""
CLEAR = {"zero_grad": "model.zero_grad()", "grad_none": "for p in model.parameters(): p.grad = None"}
UPDATE = {"no_grad": "with torch.no_grad():\n        for p in model.parameters(): p -= 0.01 * p.grad",
          "data": "for p in model.parameters(): p.data.add_(p.grad, alpha=-0.01)"}
FORWARD = "loss = nn.functional.mse_loss(model(x), y)"


@pytest.mark.parametrize("clear", sorted(CLEAR))
@pytest.mark.parametrize("update", sorted(UPDATE))
@pytest.mark.parametrize("order", ["clear_after_forward", "clear_first"])
def test_a_manual_update_is_one_step_per_iteration_in_either_order(doctor_code, order, clear, update):
    # forward -> zero_grad -> backward -> update leaves the gradients in place at the next
    # forward: only the parameters' change tells that the step ended (no step closed before)
    lines = [FORWARD, CLEAR[clear]] if order == "clear_after_forward" else [CLEAR[clear], FORWARD]
    body = "\n    ".join([*lines, "loss.backward()", UPDATE[update]])
    result = doctor_code(MANUAL.format(body=body))
    assert result.steps == 20
    assert _observations(result, "accumulation")[0]["factor"] == 1
    assert "accumulation_for_speed" not in ids(result)


def test_a_manual_update_over_two_micro_batches_is_still_accumulation(doctor_code):
    # the gradients are there at the next forward and the parameters did not move: one step goes on
    result = doctor_code(MANUAL.format(body="\n    ".join([
        FORWARD, "loss.backward()", "if step % 2 == 1:",
        "    with torch.no_grad():\n            for p in model.parameters(): p -= 0.01 * p.grad",
        "    model.zero_grad()"])))
    assert result.steps == 20
    assert _observations(result, "accumulation")[0]["factor"] == 2
