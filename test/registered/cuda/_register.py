"""SGLang's CUDA CI marker where SGLang is importable; the GPU test machine may lack SGLang."""

try:
    from sglang.test.ci.ci_register import register_cuda_ci
except ImportError:  # plain pytest on a machine without SGLang: the marker is a runtime no-op anyway

    def register_cuda_ci(est_time, suite=None, nightly=False, disabled=None, **kwargs):
        return None


__all__ = ["register_cuda_ci"]
