"""The kernel templates' Jinja2 environment keeps its compiled templates on disk: a second
environment (a new process) reads them, a changed template is compiled again, and an
unusable cache folder only turns the cache off."""
import jinja2

from smalltc import _jinja


def _env_of(sources):
    return _jinja.environment(jinja2.FunctionLoader(
        lambda name: (sources[name], name, lambda: False) if name in sources else None))


def test_compiled_templates_are_kept_and_a_changed_one_is_compiled_again(tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("SMALLTC_CACHE_DIR", str(tmp_path))
    sources = {"k.cu.j2": "int n = {{ n }};"}
    assert _env_of(sources).get_template("k.cu.j2").render(n=3) == "int n = 3;"
    kept = list((tmp_path / "jinja").iterdir())
    assert len(kept) == 1
    assert _env_of(sources).get_template("k.cu.j2").render(n=4) == "int n = 4;"
    sources["k.cu.j2"] = "long n = {{ n }};"                # a new source, same name
    assert _env_of(sources).get_template("k.cu.j2").render(n=5) == "long n = 5;"


def test_an_unusable_cache_folder_turns_the_cache_off(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SMALLTC_CACHE_DIR", str(blocker))
    env = _env_of({"t": "{{ a }}"})
    assert env.bytecode_cache is None
    assert env.get_template("t").render(a=1) == "1"


def test_undefined_names_are_errors():
    import pytest
    with pytest.raises(jinja2.UndefinedError):
        _env_of({"t": "{{ missing }}"}).get_template("t").render()
