from __future__ import annotations

import pytest
import torch
from torch import nn

from trainspeed.errors import ConfigError
from trainspeed.telemetry.flops import count_flops, count_train_step_flops

pytestmark = pytest.mark.timeout(60)

M, K, N = 4, 8, 16


def test_linear_forward_is_2mnk():
    lin = nn.Linear(K, N)
    x = torch.randn(M, K)
    assert count_flops(lambda: lin(x)) == 2 * M * N * K  # 1024


def test_linear_forward_backward_is_6mnk_when_input_needs_grad():
    lin = nn.Linear(K, N)
    x = torch.randn(M, K, requires_grad=True)
    # forward 2mnk + grad_input 2mnk + grad_weight 2mnk
    assert count_flops(lambda: lin(x).sum().backward()) == 6 * M * N * K  # 3072


def test_first_layer_backward_skips_input_grad():
    lin = nn.Linear(K, N)
    x = torch.randn(M, K)  # data: no gradient wanted -> autograd skips grad_input
    assert count_flops(lambda: lin(x).sum().backward()) == 4 * M * N * K  # 2048


def test_two_layer_mlp_hand_count():
    model = nn.Sequential(nn.Linear(K, N), nn.ReLU(), nn.Linear(N, 2))
    x = torch.randn(M, K)
    fwd = 2 * M * K * N + 2 * M * N * 2
    bwd = 2 * M * K * N + (2 * M * N * 2) * 2  # layer 1: weight grad only; layer 2: input + weight grads
    assert count_flops(lambda: model(x)) == fwd
    assert count_flops(lambda: model(x).sum().backward()) == fwd + bwd


def _mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def test_count_train_step_flops_leaves_model_untouched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(K, N), nn.BatchNorm1d(N), nn.Dropout(0.5), nn.Linear(N, 2))
    batch = (torch.randn(M, K), torch.randn(M, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # One parameter already holds an accumulated gradient (grad accumulation in progress).
    model[0].weight.grad = torch.full_like(model[0].weight, 3.0)
    rng_before = torch.get_rng_state()

    flops = count_train_step_flops(model, _mse, batch)

    fwd = 2 * M * K * N + 2 * M * N * 2
    bwd = 2 * M * K * N + 2 * (2 * M * N * 2)
    assert flops == fwd + bwd
    assert torch.equal(model[0].weight.grad, torch.full_like(model[0].weight, 3.0))
    assert model[0].bias.grad is None and model[3].weight.grad is None
    for key, value in model.state_dict().items():  # params and BatchNorm running stats
        assert torch.equal(value, before[key]), key
    assert torch.equal(torch.get_rng_state(), rng_before)


def test_count_train_step_flops_rejects_non_scalar_and_no_grad():
    model = nn.Linear(K, N)
    batch = torch.randn(M, K)
    with pytest.raises(ConfigError, match="scalar"):
        count_train_step_flops(model, lambda m, b: m(b), batch)
    with pytest.raises(ConfigError, match="does not require grad"):
        count_train_step_flops(model, lambda m, b: m(b).detach().sum(), batch)
    assert model.weight.grad is None


def test_cpu_attention_is_counted_like_the_gpu_kernels():
    # torch 2.13's FlopCounterMode has no formula for the CPU flash-attention kernel that
    # scaled_dot_product_attention runs on the CPU, and counted it as 0 (pytorch#195460).
    # Forward: Q·Kᵀ and P·V, 2·S·S·D each per head; backward (the GPU kernels' count): the
    # scores again, dP, dV, dQ and dK, 2·S·S·D each.
    b, h, s, d = 2, 4, 32, 16
    q = torch.randn(b, h, s, d, requires_grad=True)
    forward = count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    assert forward == 2 * (2 * b * h * s * s * d)
    train = count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward())
    assert train == 14 * b * h * s * s * d


def test_lstm_matmuls_are_counted():
    # On the CPU an nn.LSTM runs one fused mkldnn_rnn_layer per layer and direction, which torch's
    # FlopCounterMode counted as 0: pytorch/examples' mnist_rnn read "0.0% of the peak". Each
    # token multiplies W_ih (4H x I) and W_hh (4H x H) once: 2 FLOPs a weight; backward twice that.
    t, b, i, h = 7, 3, 5, 8
    for layers, bidirectional in ((1, False), (2, True)):
        lstm = nn.LSTM(i, h, num_layers=layers, bidirectional=bidirectional, batch_first=True)
        x = torch.randn(b, t, i)
        weights = sum(p.numel() for name, p in lstm.named_parameters() if name.startswith("weight"))
        forward = count_flops(lambda: lstm(x))
        assert forward == 2 * t * b * weights
        train = count_flops(lambda: lstm(x)[0].sum().backward())
        assert train == 3 * forward


def test_cudnn_lstm_formula_counts_every_layer_and_direction():
    # CUDA's _cudnn_rnn takes all layers' weights in one list (biases too); this machine has no GPU,
    # so the formula is checked on the shapes the counter hands it: 2 layers, bidirectional, T=7, B=3.
    from trainspeed.telemetry.flops import _fused_rnn_backward, _fused_rnn_forward

    lstm = nn.LSTM(5, 8, num_layers=2, bidirectional=True)
    shapes = [p.shape for _, p in lstm.named_parameters()]
    weights = sum(p.numel() for name, p in lstm.named_parameters() if name.startswith("weight"))
    assert _fused_rnn_forward(torch.Size([7, 3, 5]), shapes, 4) == 2 * 7 * 3 * weights
    assert _fused_rnn_backward(torch.Size([21, 5]), shapes) == 4 * 21 * weights  # a packed input's rows
