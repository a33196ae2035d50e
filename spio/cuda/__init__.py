"""CUDA access without a toolkit: the driver API (Cython), NVRTC (ctypes) and path discovery."""
