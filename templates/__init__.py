"""gpuvm's jinja2 templates. The wheel ships this directory as the package `gpuvm.templates`
(pyproject.toml maps it there); `gpuvm.templating` loads them."""
