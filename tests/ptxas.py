"""What ptxas reports of rendered CUDA sources compiled for sm_90 (nvcc only, no GPU; the
tests that use it skip without nvcc)."""
import re
import shutil
import subprocess

NVCC = shutil.which("nvcc")


def ptxas_sm90(path):
    """Compile the translation unit ``path`` for sm_90 with ``ptxas -v``: it must compile
    without a warning. Returns ``{kernel: (stack frame bytes, spill store bytes)}`` and the
    log."""
    res = subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "-cubin", "-o", "/dev/null",
                          "-Xptxas", "-v", str(path)], capture_output=True, text=True)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log
    assert not re.search(r"warning", log), log
    frames = re.findall(r"Function properties for (\w+)\n\s+(\d+) bytes stack frame, "
                        r"(\d+) bytes spill stores", log)
    return {e: (int(stack), int(spill)) for e, stack, spill in frames}, log


def compiles_clean(path, kernels):
    """``kernels`` ({entry: rendered source}) in one translation unit at ``path``, each in
    its namespace: every entry compiles for sm_90 without a warning, a stack frame or a
    spill store."""
    path.write_text("".join(f"namespace ns{i} {{\n{src}\n}}\n"
                            for i, src in enumerate(kernels.values())))
    frames, _ = ptxas_sm90(path)
    assert set(frames) == set(kernels)
    bad = {e: f for e, f in frames.items() if f != (0, 0)}      # (stack, spill) bytes
    assert not bad, bad
