"""MLX prompt-cache probe: measures what mlx-lm actually reuses, turn after turn.

Importing this package does not import mlx: the main side only needs `reports`.
No Django imports anywhere here: the Mac worker that runs it has no database.
"""

from __future__ import annotations
