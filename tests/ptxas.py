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
