"""Every `gin/mesh/*.gin` preset parses and builds the mesh it promises on 8 devices."""

import pathlib

import gin
import pytest

from evotrainer.sharding.mesh import make_mesh

MESH_GIN = pathlib.Path(__file__).resolve().parents[2] / "gin" / "mesh"

# preset -> (data, fsdp, tensor) on the 8 test devices, or the error it must raise there.
EXPECTED = {
    "single": "1\\*1\\*1 = 1 but 8 devices are available",
    "data": (8, 1, 1),
    "fsdp": (1, 8, 1),
    "fsdp_tp": (1, 2, 4),
}


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _parse(name: str):
  gin.parse_config_files_and_bindings([str(MESH_GIN / f"{name}.gin")], None)


def test_every_preset_has_an_expectation():
  assert sorted(p.stem for p in MESH_GIN.glob("*.gin")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_on_8_devices(name, devices):
  _parse(name)
  expected = EXPECTED[name]
  if isinstance(expected, str):
    with pytest.raises(ValueError, match=expected):
      make_mesh()
  else:
    mesh = make_mesh()
    assert tuple(mesh.shape.values()) == expected
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert mesh.size == len(devices)


def test_single_on_one_device(devices):
  _parse("single")
  mesh = make_mesh(devices=devices[:1])
  assert tuple(mesh.shape.values()) == (1, 1, 1)


def test_fsdp_tp_needs_a_multiple_of_4_devices(devices):
  _parse("fsdp_tp")
  with pytest.raises(ValueError, match="6 devices not divisible by 4"):
    make_mesh(devices=devices[:6])


def test_module_qualified_binding(devices):
  gin.parse_config("mesh.make_mesh.fsdp = 4\nmesh.make_mesh.tensor = 2\nmake_mesh.data = 1")
  assert tuple(make_mesh().shape.values()) == (1, 4, 2)
