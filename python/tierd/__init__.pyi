from tierd._native import *  # noqa: F401,F403
from tierd._native import __version__ as __version__, adamw_step as adamw_step
