"""Each decision trust rests on, just inside and just outside: a signature (missing, another
key, another algorithm, a flipped byte, not base64, an edited manifest), the files a signed
manifest lists (a byte changed, one added, one removed, a link), the key files (prefixes,
encodings, permissions) and the user's keyring (own key, keys added, keys removed).

Fast: a small artefact copied from tests/data (format 2's mlp), no pipeline run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from aotpipe.artifact.manifest import seal
from aotpipe.cli import main
from aotpipe.errors import AotpipeError, ArtifactError
from aotpipe.format import limits
from aotpipe.format.limits import Breach
from aotpipe.trust import keyring
from aotpipe.trust.signing import (
    absolute_key_spec,
    check_signature,
    load_key,
    manifest_bytes,
    signature_record,
    signer,
    split_key_spec,
)
from aotpipe.trust.verify import find_artifacts, read_manifest, sign_artifact, verify_artifact, verify_tree

DATA = Path(__file__).resolve().parent.parent / "data" / "format_v2" / "mlp"
SECRET = bytes(range(64))


def cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


@pytest.fixture()
def art(tmp_path):
    dst = tmp_path / "lib" / "mlp"
    shutil.copytree(DATA, dst)
    return dst


@pytest.fixture()
def keys(tmp_path):
    folder = tmp_path / "keys"
    folder.mkdir()
    out = {"hmac": folder / "secret.key"}
    out["hmac"].write_bytes(SECRET)
    for name, seed in (("", 3), ("other_", 4)):
        k = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)
        out[f"{name}private"] = folder / f"{name}key.pem"
        out[f"{name}private"].write_bytes(k.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8,
                                                          ser.NoEncryption()))
        out[f"{name}public"] = folder / f"{name}key.pub.pem"
        out[f"{name}public"].write_bytes(k.public_key().public_bytes(ser.Encoding.PEM,
                                                                     ser.PublicFormat.SubjectPublicKeyInfo))
        out[f"{name}raw"] = k.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
        out[f"{name}object"] = k
    return out


@pytest.fixture()
def config(tmp_path, monkeypatch):
    folder = tmp_path / "config"
    monkeypatch.setenv("AOTPIPE_CONFIG_DIR", str(folder))
    return folder


def _sign(folder: Path, spec) -> Path:
    (folder / "signature.json").write_bytes(signature_record(manifest_bytes(folder), load_key(spec, for_signing=True)))
    return folder


def _sig(folder: Path) -> dict:
    return json.loads((folder / "signature.json").read_text())


def _put_sig(folder: Path, record: dict) -> None:
    (folder / "signature.json").write_text(json.dumps(record))


# ---------------------------------------------------------------------------------------
# Key specs

def test_a_key_spec_names_its_algorithm_or_none():
    assert split_key_spec("ed25519:k.pem") == ("ed25519", Path("k.pem"))
    assert split_key_spec("hmac:s.key") == ("hmac-sha256", Path("s.key"))
    assert split_key_spec("s.key") == (None, Path("s.key"))
    assert split_key_spec("rsa:k.pem") == (None, Path("rsa:k.pem"))  # not a prefix aotpipe knows: a file name
    with pytest.raises(AotpipeError, match=r"^--key hmac:: no key file after hmac: \(--key hmac:FILE\)$"):
        split_key_spec("hmac:")
    with pytest.raises(AotpipeError, match="no key file after ed25519:"):
        split_key_spec("ed25519:")


def test_an_absolute_key_spec_keeps_its_prefix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_key_spec("hmac:s.key") == f"hmac:{tmp_path / 's.key'}"
    assert absolute_key_spec("ed25519:k.pem") == f"ed25519:{tmp_path / 'k.pem'}"
    assert absolute_key_spec("k.pem") == str(tmp_path / "k.pem")


# ---------------------------------------------------------------------------------------
# Key files

def test_every_ed25519_private_encoding_signs_and_its_public_half_verifies(art, keys, tmp_path):
    k = keys["object"]
    forms = {
        "pem": k.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()),
        "der": k.private_bytes(ser.Encoding.DER, ser.PrivateFormat.PKCS8, ser.NoEncryption()),
        "der as base64": base64.b64encode(k.private_bytes(ser.Encoding.DER, ser.PrivateFormat.PKCS8,
                                                          ser.NoEncryption())),
        "openssh": k.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption()),
    }
    want = hashlib.sha256(keys["raw"]).hexdigest()[:16]
    for name, data in forms.items():
        f = tmp_path / f"k.{name.replace(' ', '_')}"
        f.write_bytes(data)
        key = load_key(f, for_signing=True)
        assert key.algorithm == "ed25519" and key.key_id == want and key.sign is not None, name
        _sign(art, f)
        assert check_signature(art, keys["public"]) == [], name
        assert check_signature(art, f) == [], name  # a private key verifies too


def test_a_public_key_cannot_sign(art, keys):
    key = load_key(keys["public"])
    assert key.sign is None and key.algorithm == "ed25519"
    with pytest.raises(AotpipeError, match="a public key verifies but cannot sign; sign with the private key"):
        load_key(keys["public"], for_signing=True)
    with pytest.raises(AotpipeError, match="a public key cannot sign; give the Ed25519 private key"):
        signature_record(b"{}", key)


def test_a_key_of_another_type_is_refused_naming_it(tmp_path):
    k = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    f = tmp_path / "rsa.pem"
    f.write_bytes(k.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(AotpipeError, match=r"rsa\.pem: a RSAPublicKey key; aotpipe signs with Ed25519 keys"):
        load_key(f)


def test_an_unreadable_key_file_is_one_line(tmp_path):
    with pytest.raises(AotpipeError, match=r"nope\.key: cannot read the key file \(No such file or directory\)"):
        load_key(tmp_path / "nope.key")
    with pytest.raises(AotpipeError, match="cannot read the key file"):
        load_key(tmp_path)  # a folder


def test_a_key_file_over_64_KiB_is_refused_and_one_at_it_is_read(tmp_path):
    at = tmp_path / "at.key"
    at.write_bytes(b"\x01" * (64 << 10))
    assert load_key(at).algorithm == "hmac-sha256"
    over = tmp_path / "over.key"
    over.write_bytes(b"\x01" * ((64 << 10) + 1))
    with pytest.raises(AotpipeError, match=r"over\.key: more than 65\.5 kB, over the limit of 65\.5 kB"):
        load_key(over)


def test_ed25519_prefix_on_a_file_that_is_no_key_says_how_to_make_one(tmp_path):
    f = tmp_path / "s.key"
    f.write_bytes(SECRET)
    with pytest.raises(AotpipeError, match=r"not an Ed25519 key in any encoding aotpipe reads \(PEM, DER, OpenSSH, "
                                           r"raw 32 bytes\); make one with: openssl genpkey"):
        load_key(f"ed25519:{f}")


def test_key_ids_tell_keys_apart_and_are_stable(keys, tmp_path):
    assert load_key(keys["public"]).key_id == hashlib.sha256(keys["raw"]).hexdigest()[:16]
    assert load_key(keys["private"]).key_id == load_key(keys["public"]).key_id
    assert load_key(keys["other_public"]).key_id != load_key(keys["public"]).key_id
    h = load_key(keys["hmac"])
    assert h.key_id == __import__("hmac").new(SECRET, b"aotpipe key id", hashlib.sha256).hexdigest()[:16]
    other = tmp_path / "other.key"
    other.write_bytes(SECRET[::-1])
    assert load_key(other).key_id != h.key_id


# ---------------------------------------------------------------------------------------
# Signatures

@pytest.mark.parametrize("kind", ["hmac", "private"])
def test_a_good_signature_passes_and_names_what_it_signed(art, keys, kind):
    _sign(art, keys[kind])
    rec = _sig(art)
    manifest = (art / "manifest.json").read_bytes()
    assert rec["format_version"] == 1 and rec["signed_file"] == "manifest.json"
    assert rec["manifest_sha256"] == hashlib.sha256(manifest).hexdigest()
    assert rec["key_id"] == load_key(keys[kind]).key_id
    assert rec["algorithm"] == ("hmac-sha256" if kind == "hmac" else "ed25519")
    assert check_signature(art, keys["hmac" if kind == "hmac" else "public"]) == []


def test_the_signature_covers_a_context_so_a_bare_signature_of_the_manifest_fails(art, keys):
    manifest = (art / "manifest.json").read_bytes()
    _sign(art, keys["private"])
    rec = _sig(art)
    rec["signature"] = base64.b64encode(keys["object"].sign(manifest)).decode()
    _put_sig(art, rec)
    (problem,) = check_signature(art, keys["public"])
    assert "the signature does not match manifest.json" in problem


def test_a_missing_signature_is_one_problem(art, keys):
    assert check_signature(art, keys["public"]) == [
        f"{art / 'signature.json'}: missing (the artefact is not signed; aotpipe sign it)"]


def test_a_signature_by_another_key_names_both_key_ids(art, keys):
    _sign(art, keys["other_private"])
    (problem,) = check_signature(art, keys["public"])
    theirs, mine = load_key(keys["other_public"]).key_id, load_key(keys["public"]).key_id
    assert (f"signed with another key (key id {theirs}; {keys['public']} is {mine}): the artefact is not the one "
            "the key holder signed") in problem


def test_a_manifest_changed_after_signing_is_named(art, keys):
    _sign(art, keys["hmac"])
    m = json.loads((art / "manifest.json").read_text())
    m["model"]["name"] = "other"
    (art / "manifest.json").write_bytes(seal(m))
    (problem,) = check_signature(art, keys["hmac"])
    assert "manifest.json was changed after it was signed" in problem


@pytest.mark.parametrize("where", [0, -1])
def test_a_flipped_signature_byte_fails(art, keys, where):
    _sign(art, keys["private"])
    rec = _sig(art)
    raw = bytearray(base64.b64decode(rec["signature"]))
    raw[where] ^= 1
    rec["signature"] = base64.b64encode(bytes(raw)).decode()
    _put_sig(art, rec)
    (problem,) = check_signature(art, keys["public"])
    assert problem.endswith("the signature does not match manifest.json: the artefact is not the one the key "
                            "holder signed")


def test_a_signature_that_is_not_base64_is_named(art, keys):
    _sign(art, keys["hmac"])
    rec = _sig(art)
    rec["signature"] = rec["signature"][:-2] + "!!"
    _put_sig(art, rec)
    assert check_signature(art, keys["hmac"]) == [f"{art / 'signature.json'}: the signature is not base64"]


def test_a_signature_record_of_another_shape_is_named(art, keys):
    _sign(art, keys["hmac"])
    rec = _sig(art)
    rec["format_version"] = 99
    _put_sig(art, rec)
    (problem,) = check_signature(art, keys["hmac"])
    assert problem.endswith("(not a signature record of version 1)"), problem
    (art / "signature.json").write_text("not json")
    (problem,) = check_signature(art, keys["hmac"])
    assert "signature.json" in problem and "version 1" not in problem


@pytest.mark.parametrize("signed,checked", [("hmac", "public"), ("private", "hmac")])
def test_a_signature_is_checked_only_with_a_key_of_its_algorithm(art, keys, signed, checked):
    _sign(art, keys[signed])
    (problem,) = check_signature(art, keys[checked])
    a, b = ("hmac-sha256", "ed25519") if signed == "hmac" else ("ed25519", "hmac-sha256")
    assert f"signed with {a}, but {keys[checked]} is an {b} key" in problem


def test_signer_loads_the_key_first_and_signs_each_folder(art, keys, tmp_path):
    with pytest.raises(AotpipeError, match="cannot sign"):
        signer(keys["public"])
    sign = signer(keys["hmac"])
    sign(art)
    assert check_signature(art, keys["hmac"]) == []


# ---------------------------------------------------------------------------------------
# The files a signed manifest lists

def _signed(art, keys):
    _sign(art, keys["private"])
    assert check_signature(art, keys["public"]) == [] and verify_artifact(art, load_graphs=False) == []
    return art


def test_a_byte_changed_after_signing_is_caught(art, keys):
    _signed(art, keys)
    graph = art / "mlp_inference_0" / "graph.json"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 1
    graph.write_bytes(bytes(data))
    assert verify_artifact(art, load_graphs=False) == [
        f"{graph}: sha256 differs from the manifest (the file was changed or truncated)"]


def test_a_file_added_after_signing_is_caught_and_signature_json_is_not_one(art, keys):
    _signed(art, keys)
    (art / "mlp_inference_0" / "extra.py").write_text("import os\n")
    assert verify_artifact(art, load_graphs=False) == [
        f"{art / 'mlp_inference_0' / 'extra.py'}: not listed in the manifest"]


def test_a_file_removed_after_signing_is_caught(art, keys):
    _signed(art, keys)
    (art / "mlp_inference_0" / "module.py").unlink()
    assert verify_artifact(art, load_graphs=False) == [f"{art / 'mlp_inference_0' / 'module.py'}: missing"]


def test_a_listed_file_replaced_by_a_link_is_caught(art, keys):
    _signed(art, keys)
    module = art / "mlp_inference_0" / "module.py"
    copy = art.parent / "module.py"
    shutil.copy(module, copy)
    module.unlink()
    module.symlink_to(copy)
    assert verify_artifact(art, load_graphs=False) == [f"{module}: not a regular file (a link or device)"]


def test_a_manifest_whose_checksum_does_not_match_is_caught(art):
    m = json.loads((art / "manifest.json").read_text())
    m["model"]["name"] = "other"
    (art / "manifest.json").write_text(json.dumps(m))
    assert verify_artifact(art, load_graphs=False) == [
        f"{art / 'manifest.json'}: its checksum does not match its content (the file was changed)"]


@pytest.mark.parametrize("name", ["/etc/passwd", "../outside", "manifest.json", "signature.json", "a\nb"])
def test_a_manifest_listing_a_file_outside_or_its_own_files_is_refused(art, name):
    m = json.loads((art / "manifest.json").read_text())
    m["files"][name] = "0" * 64
    (art / "manifest.json").write_bytes(seal(m))
    problems = verify_artifact(art, load_graphs=False)
    assert f"{art / 'manifest.json'}: bad file name {ascii(name)}" in problems, problems


def test_a_manifest_that_is_missing_not_json_or_not_an_object(tmp_path):
    assert read_manifest(tmp_path) == (None, [f"{tmp_path / 'manifest.json'}: missing (an incomplete artefact: run "
                                              "the pipeline again)"])
    (tmp_path / "manifest.json").write_text("[1, 2]")
    assert read_manifest(tmp_path) == (None, [f"{tmp_path / 'manifest.json'}: not a manifest"])
    assert verify_artifact(tmp_path) == [f"{tmp_path / 'manifest.json'}: not a manifest"]
    (tmp_path / "manifest.json").write_text("{")
    manifest, problems = read_manifest(tmp_path)
    assert manifest is None and len(problems) == 1 and "manifest.json" in problems[0]


def test_a_manifest_of_an_unknown_version_is_refused_before_its_files(art):
    m = json.loads((art / "manifest.json").read_text())
    m["format_version"] = 999
    (art / "manifest.json").write_bytes(seal(m))
    (problem,) = verify_artifact(art, load_graphs=False)
    assert "manifest.json" in problem and "999" in problem


def _list_file(art: Path, rel: str, size: int) -> Path:
    f = art / rel
    f.write_bytes(b"\0" * size)
    m = json.loads((art / "manifest.json").read_text())
    m["files"][rel] = hashlib.sha256(f.read_bytes()).hexdigest()
    (art / "manifest.json").write_bytes(seal(m))
    return f


@pytest.mark.parametrize("over", [0, 1])
def test_a_listed_file_over_the_size_limit_is_a_breach_not_hashed(art, over):
    # the bound: one tensor (max_tensor_bytes) and a 1 MiB header, or a record, whichever is more
    big = _list_file(art, "blobs/big.bin", (1 << 20) + 1 + over)
    with limits.override(max_record_bytes=1 << 15, max_tensor_bytes=1):
        problems = verify_artifact(art, load_graphs=False)
    if over:
        (problem,) = problems
        assert isinstance(problem, Breach) and problem.startswith(f"{big}: ") and "AOTPIPE_MAX_TENSOR_BYTES" in problem
    else:
        assert problems == []


def test_sign_refuses_an_artefact_that_does_not_verify(art, keys):
    (art / "stray").write_text("x")
    with pytest.raises(ArtifactError, match="not signed, it does not verify: .*stray: not listed in the manifest$"):
        sign_artifact(art, keys["hmac"])
    (art / "stray2").write_text("x")
    with pytest.raises(ArtifactError, match=r"not listed in the manifest \(and 1 more\)$"):
        sign_artifact(art, keys["hmac"])
    assert not (art / "signature.json").exists()


def test_verify_tree_checks_the_signature_first_and_reads_no_further(art, keys, tmp_path):
    (art / "stray").write_text("x")
    out = verify_tree(art.parent, keys["hmac"])
    assert out == {art: [f"{art / 'signature.json'}: missing (the artefact is not signed; aotpipe sign it)"]}
    assert verify_tree(art.parent) == {art: [f"{art / 'stray'}: not listed in the manifest"]}


def test_verify_tree_names_an_unfinished_folder_and_finds_nested_models(art, tmp_path):
    root = art.parent
    (root / "half" / "half_0").mkdir(parents=True)
    (root / "half" / "half_0" / "graph.json").write_text("{}")
    (root / ".hidden" / "x").mkdir(parents=True)
    shutil.copy(art / "manifest.json", root / ".hidden" / "x" / "manifest.json")
    models, unfinished = find_artifacts(root)
    assert models == [art] and unfinished == [root / "half"]
    assert find_artifacts(art) == ([art], [])
    out = verify_tree(root, trust_ops=())
    assert out[root / "half"] == [f"{root / 'half' / 'manifest.json'}: missing (an incomplete artefact: run the "
                                  "pipeline again)"]


# ---------------------------------------------------------------------------------------
# The keyring: the user's own key and the keys they trust

def test_the_config_folder_is_chosen_by_env_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("AOTPIPE_CONFIG_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "x"))
    assert keyring.config_dir() == tmp_path / "a"
    monkeypatch.setenv("AOTPIPE_CONFIG_DIR", "")
    assert keyring.config_dir() == tmp_path / "x" / "aotpipe"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert keyring.config_dir() == tmp_path / "home" / ".config" / "aotpipe"


def test_the_own_key_is_made_once_owner_only(config, monkeypatch):
    monkeypatch.setattr(os, "umask", os.umask)
    old = os.umask(0)
    try:
        assert keyring.own_key(create=False) is None and not config.exists()
        path = keyring.own_key()
    finally:
        os.umask(old)
    assert path == config / "signing-key.pem"
    assert stat.S_IMODE(config.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    first = path.read_bytes()
    assert keyring.own_key() == path and path.read_bytes() == first
    assert keyring.own_key(create=False) == path
    assert load_key(path, for_signing=True).algorithm == "ed25519"
    assert [p.name for p in config.iterdir()] == ["signing-key.pem"]  # no temporary file left


def test_public_pem_is_the_public_half_and_an_hmac_secret_has_none(keys):
    assert keyring.public_pem(keys["private"]) == keys["public"].read_bytes()
    assert keyring.public_pem(f"ed25519:{keys['public']}") == keys["public"].read_bytes()
    with pytest.raises(AotpipeError, match="an HMAC secret cannot be trusted this way"):
        keyring.public_pem(f"hmac:{keys['hmac']}")


def test_add_list_and_remove_trusted_keys(config, keys):
    own = keyring.own_key()
    path = keyring.add_trusted(keys["private"], "alice")
    assert path == config / "trusted" / "alice.pem" and path.read_bytes() == keys["public"].read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert keyring.add_trusted(keys["public"], "alice") == path  # the same key again: fine
    with pytest.raises(AotpipeError, match="a key named alice is trusted already; remove it first"):
        keyring.add_trusted(keys["other_public"], "alice")
    named = keyring.add_trusted(keys["other_public"])
    assert named.stem == load_key(keys["other_public"]).key_id
    assert keyring.trusted_keys() == [own, path, named] or keyring.trusted_keys() == [own] + sorted([path, named])
    assert keyring.remove_trusted("alice") == path and not path.exists()
    with pytest.raises(AotpipeError, match=rf"no trusted key named 'alice' \(trusted: {named.stem}; aotpipe trust list\)"):
        keyring.remove_trusted("alice")


@pytest.mark.parametrize("name,ok", [("a", True), ("a" * 64, True), ("a" * 65, False), ("-a", False),
                                     ("a/b", False), ("a.b_c-1", True), ("", True)])
def test_a_trusted_key_name_is_a_plain_name_of_at_most_64(config, keys, name, ok):
    if ok:
        assert keyring.add_trusted(keys["public"], name or None).exists()
    else:
        with pytest.raises(AotpipeError, match="a name is letters, digits"):
            keyring.add_trusted(keys["public"], name)


def test_remove_refuses_a_name_that_is_no_plain_name_even_if_the_file_exists(config, keys):
    keyring.add_trusted(keys["public"], "alice")
    (config / "x.pem").write_bytes(keys["public"].read_bytes())
    with pytest.raises(AotpipeError, match=r"no trusted key named '\.\./x' \(trusted: alice;"):
        keyring.remove_trusted("../x")
    assert (config / "x.pem").exists()
    with pytest.raises(AotpipeError, match=r"\(trusted: none;"):
        keyring.remove_trusted("alice") and keyring.remove_trusted("alice")


def test_trusted_keys_are_own_first_then_pem_files_only(config, keys):
    assert keyring.trusted_keys() == []
    keyring.add_trusted(keys["public"], "bob")
    (config / "trusted" / "notes.txt").write_text("x")
    (config / "trusted" / "dir.pem").mkdir()
    assert keyring.trusted_keys() == [config / "trusted" / "bob.pem"]
    own = keyring.own_key()
    assert keyring.trusted_keys() == [own, config / "trusted" / "bob.pem"]


@pytest.mark.parametrize("which", ["config", "trusted", "key", "own key"])
def test_a_keyring_others_may_write_is_refused(config, keys, which):
    keyring.own_key()
    path = keyring.add_trusted(keys["public"], "bob")
    target = {"config": config, "trusted": path.parent, "key": path, "own key": config / "signing-key.pem"}[which]
    mode = stat.S_IMODE(target.stat().st_mode)
    target.chmod(mode | 0o020)
    with pytest.raises(AotpipeError, match=rf"{target}: .* is writable by others or not yours \(mode "
                                           rf"{mode | 0o020:o}\); chmod go-w"):
        keyring.trusted_keys()
    target.chmod(mode | 0o004)  # others may read: fine
    assert len(keyring.trusted_keys()) == 2


def test_signed_key_id_reads_signature_json_or_gives_none(art, keys):
    assert keyring.signed_key_id(art) is None
    _sign(art, keys["hmac"])
    assert keyring.signed_key_id(art) == load_key(keys["hmac"]).key_id
    (art / "signature.json").write_text("{}")
    assert keyring.signed_key_id(art) is None


def test_provenance_problems_unsigned_untrusted_trusted_and_edited(art, keys, config):
    (problem,) = keyring.provenance_problems(art)
    assert problem == (f"{art}: not signed (made elsewhere, or before aotpipe signed what it writes); aotpipe trust add "
                       "its maker's public key, or aotpipe sign it yourself")
    _sign(art, keys["private"])
    kid = load_key(keys["public"]).key_id
    assert keyring.provenance_problems(art) == [f"{art}: signed by key {kid}, which you do not trust (aotpipe trust "
                                                "list; aotpipe trust add KEY to trust it)"]
    keyring.add_trusted(keys["public"], "alice")
    assert keyring.provenance_problems(art) == []
    (art / "stray").write_text("x")
    assert keyring.provenance_problems(art) == [f"{art / 'stray'}: not listed in the manifest"]
    (art / "stray").unlink()
    rec = _sig(art)
    rec["signature"] = base64.b64encode(b"\0" * 64).decode()
    _put_sig(art, rec)
    (problem,) = keyring.provenance_problems(art)
    assert "the signature does not match manifest.json" in problem


def test_provenance_trusts_the_users_own_key_with_no_keys_added(art, config):
    _sign(art, keyring.own_key())
    assert keyring.provenance_problems(art) == []
    r = cli("trust", "list")
    assert r.exit_code == 0 and "(your own)" in r.output, r.output


def test_a_hmac_signature_with_the_same_key_id_is_not_trusted_by_provenance(art, keys, config):
    """A trusted key is Ed25519: an HMAC signature naming its key id is checked as Ed25519, and fails."""
    keyring.add_trusted(keys["public"], "alice")
    _sign(art, keys["hmac"])
    rec = _sig(art)
    rec["key_id"] = load_key(keys["public"]).key_id
    _put_sig(art, rec)
    (problem,) = keyring.provenance_problems(art)
    assert "signed with hmac-sha256, but" in problem


# ---------------------------------------------------------------------------------------
# More boundaries: what only loading the graphs finds, every problem at once, the keyring's modes

def _reseal(art: Path) -> None:
    m = json.loads((art / "manifest.json").read_text())
    m["files"] = {p.relative_to(art).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in sorted(art.rglob("*")) if p.is_file() and p.name not in ("manifest.json", "signature.json")}
    (art / "manifest.json").write_bytes(seal(m))


def test_sign_artifact_signs_an_artefact_that_verifies(art, keys):
    assert sign_artifact(art, keys["private"]) == art / "signature.json"
    assert check_signature(art, keys["public"]) == []
    with pytest.raises(AotpipeError, match="a public key verifies but cannot sign"):
        sign_artifact(art, keys["other_public"])
    assert check_signature(art, keys["public"]) == []


def test_a_module_py_that_is_not_graph_json_s_is_found_only_by_loading(art):
    module = art / "mlp_inference_0" / "module.py"
    module.write_text(module.read_text().replace("aten.relu.default(addmm)", "aten.neg.default(addmm)"))
    _reseal(art)  # a forger's edit: every hash fits
    assert verify_artifact(art, load_graphs=False) == []
    (problem,) = verify_artifact(art)
    assert str(module) in problem and "neg" in problem, problem


def test_a_graph_json_that_does_not_load_is_one_problem(art):
    graph = art / "mlp_inference_0" / "graph.json"
    g = json.loads(graph.read_text())
    node = next(n for n in g["nodes"] if n["op"] == "call_function")
    node["target"] = "os.system"
    graph.write_text(json.dumps(g))
    _reseal(art)
    assert verify_artifact(art, load_graphs=False) == []
    (problem,) = verify_artifact(art)
    assert "graph.json" in problem and "os.system" in problem, problem


def test_the_trust_decision_builds_no_graph(art, keys, config, monkeypatch):
    _sign(art, keys["private"])
    keyring.add_trusted(keys["public"], "alice")

    def no(*args, **kwargs):
        raise AssertionError("a graph was loaded to decide trust")

    monkeypatch.setattr("aotpipe.artifact.load.load", no)
    assert keyring.provenance_problems(art) == []
    from aotpipe.trust.sandbox.decide import trust_problems

    assert trust_problems(art, str(keys["public"])) == []


def test_every_problem_of_each_kind_is_reported_not_only_the_first(art, tmp_path):
    m = json.loads((art / "manifest.json").read_text())
    for name in ("../a", "../b"):
        m["files"][name] = "0" * 64
    for name in ("gone1", "gone2"):
        m["files"][name] = "0" * 64
    for name in ("link1", "link2"):
        (art / name).symlink_to(tmp_path)
        m["files"][name] = "0" * 64
    for name in ("a" * 300, "b" * 300):  # longer than a file name may be: lstat fails
        m["files"][name] = "0" * 64
    for name in ("changed1", "changed2"):
        (art / name).write_text("x")
        m["files"][name] = "0" * 64
    (art / "manifest.json").write_bytes(seal(m))
    for name in ("stray1", "stray2"):
        (art / name).write_text("x")
    problems = verify_artifact(art, load_graphs=False)
    for needle in ("bad file name '../a'", "bad file name '../b'", "gone1: missing", "gone2: missing",
                   "link1: not a regular file", "link2: not a regular file", "a" * 300 + ": cannot read (File name too long)",
                   "b" * 300 + ": cannot read (File name too long)", "changed1: sha256 differs", "changed2: sha256 differs",
                   "stray1: not listed", "stray2: not listed"):
        assert sum(needle in p for p in problems) == 1, (needle, problems)
    assert all(isinstance(p, str) and p.startswith(str(art)) for p in problems), problems


def test_two_files_over_the_size_bound_are_both_breaches(art):
    a = _list_file(art, "blobs/a.bin", (1 << 20) + 2)
    b = _list_file(art, "blobs/b.bin", (1 << 20) + 2)
    with limits.override(max_record_bytes=1 << 15, max_tensor_bytes=1):
        problems = verify_artifact(art, load_graphs=False)
    assert sorted(p.split(": ")[0] for p in problems) == [str(a), str(b)]
    assert all(isinstance(p, Breach) and "2 MB on disk" in p or "1.05 MB on disk" in p for p in problems), problems


def test_without_max_tensor_bytes_the_bound_names_max_bytes(art):
    big = _list_file(art, "blobs/big.bin", (1 << 20) + 2)
    with limits.override(max_record_bytes=1 << 15, max_bytes=1):
        (problem,) = verify_artifact(art, load_graphs=False)
    assert problem.startswith(f"{big}: 1.05 MB on disk, over the limit of") and "AOTPIPE_MAX_BYTES" in problem, problem


def test_a_manifest_over_the_record_limit_is_a_breach_and_bad_json_is_not(art, tmp_path):
    with limits.override(max_record_bytes=100):
        (problem,) = verify_artifact(art, load_graphs=False)
    assert isinstance(problem, Breach) and "AOTPIPE_MAX_RECORD_BYTES" in problem, problem
    (art / "manifest.json").write_text("{")
    (problem,) = verify_artifact(art, load_graphs=False)
    assert not isinstance(problem, Breach) and str(art / "manifest.json") in problem


def test_a_manifest_missing_a_field_is_named_after_its_checksum(art):
    m = json.loads((art / "manifest.json").read_text())
    del m["fingerprint"]
    (art / "manifest.json").write_bytes(seal(m))
    (problem,) = verify_artifact(art, load_graphs=False)
    assert str(art / "manifest.json") in problem and "fingerprint" in problem, problem
    m["model"]["name"] = "x"
    (art / "manifest.json").write_text(json.dumps(m))  # not resealed either: both said, checksum first
    checksum, field = verify_artifact(art, load_graphs=False)
    assert "its checksum does not match" in checksum and "fingerprint" in field


def test_unfinished_folders_are_named_once_by_graph_or_inputs(tmp_path):
    for d, f in (("a/a_0", "inputs.json"), ("b/x_0", "graph.json"), ("b/y_0", "graph.json"), ("c/c_0", "other"),
                 ("d/notes", "graph.json")):  # a folder not named like a graph folder of subgraph 0: not one
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / f).write_text("{}")
    assert find_artifacts(tmp_path) == ([], [tmp_path / "a", tmp_path / "b"])


def test_the_own_key_folder_is_made_with_its_parents(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTPIPE_CONFIG_DIR", str(tmp_path / "deep" / "er" / "config"))
    assert keyring.own_key() == tmp_path / "deep" / "er" / "config" / "signing-key.pem"


def test_keys_added_under_a_group_writable_umask_are_still_trusted(config, keys):
    old = os.umask(0o002)
    try:
        keyring.own_key()
        keyring.add_trusted(keys["public"], "alice")
    finally:
        os.umask(old)
    assert len(keyring.trusted_keys()) == 2
    assert stat.S_IMODE((config / "trusted").stat().st_mode) & 0o077 == 0


@pytest.mark.parametrize("which,what", [("config", "the folder of the keys you trust"),
                                        ("trusted", "the folder of the keys you trust"),
                                        ("key", "a key you trust"), ("own key", "a key you trust")])
def test_the_keyring_names_what_others_may_write(config, keys, which, what):
    keyring.own_key()
    path = keyring.add_trusted(keys["public"], "bob")
    target = {"config": config, "trusted": path.parent, "key": path, "own key": config / "signing-key.pem"}[which]
    target.chmod(stat.S_IMODE(target.stat().st_mode) | 0o002)
    with pytest.raises(AotpipeError, match=f"{target}: {what} is writable by others or not yours"):
        keyring.trusted_keys()


def test_folders_others_may_enter_and_read_are_fine(config, keys):
    keyring.own_key()
    path = keyring.add_trusted(keys["public"], "bob")
    for folder in (config, path.parent):
        folder.chmod(0o755)
    assert len(keyring.trusted_keys()) == 2
    r = cli("trust", "key")
    assert r.exit_code == 0, r.output


def test_the_signing_key_folder_names_itself_when_others_may_write_it(config, monkeypatch):
    config.mkdir(mode=0o700)
    config.chmod(0o770)
    with pytest.raises(AotpipeError, match=f"{config}: the folder for your signing key is writable by others"):
        keyring.own_key()


def test_remove_names_every_key_still_trusted(config, keys):
    keyring.own_key()
    keyring.add_trusted(keys["public"], "alice")
    keyring.add_trusted(keys["other_public"], "bob")
    with pytest.raises(AotpipeError, match=r"no trusted key named 'carol' \(trusted: alice, bob; aotpipe trust list\)"):
        keyring.remove_trusted("carol")


def test_an_hmac_spec_names_the_fix_when_trusted(keys, config):
    with pytest.raises(AotpipeError, match=r"an HMAC secret cannot be trusted this way \(whoever verifies with it can "
                                           r"also sign\); trust a colleague's Ed25519 public key, or pass --key "
                                           r"hmac:FILE each time$"):
        keyring.add_trusted(f"hmac:{keys['hmac']}")


def test_a_manifest_over_the_record_limit_is_a_signature_problem_naming_the_limit(art, keys):
    _sign(art, keys["hmac"])
    with limits.override(max_record_bytes=2000):  # signature.json fits, manifest.json does not
        (problem,) = check_signature(art, keys["hmac"])
    assert problem.startswith(f"{art / 'manifest.json'}: ") and "AOTPIPE_MAX_RECORD_BYTES" in problem, problem


def test_the_key_to_sign_with_is_the_one_given_else_the_users_own_absolute_and_never_a_public_key(tmp_path,
                                                                                                  monkeypatch):
    monkeypatch.setenv("AOTPIPE_CONFIG_DIR", str(tmp_path / "config"))
    own = keyring.signing_key_spec()  # made on first use, as an absolute spec
    assert own == str((tmp_path / "config" / keyring.OWN_KEY).resolve())
    other = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "other.pem").write_bytes(other.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8,
                                                             ser.NoEncryption()))
    monkeypatch.chdir(tmp_path)  # a relative file given: made absolute (workers run from other folders)
    assert keyring.signing_key_spec("other.pem") == str((tmp_path / "other.pem").resolve())
    (tmp_path / "public.pem").write_bytes(other.public_key().public_bytes(ser.Encoding.PEM,
                                                                          ser.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(AotpipeError, match="public"):
        keyring.signing_key_spec("public.pem")
