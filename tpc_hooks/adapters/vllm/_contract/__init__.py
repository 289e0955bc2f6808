"""tpc-hooks' contract with vLLM: every vLLM name the plugin uses, declared in one table
(``_surface``), and the vocabulary of its rows with their static checks (``_checks``).
"""

from .checks import CHANGED as CHANGED
from .checks import MISSING as MISSING
from .checks import OK as OK
from .checks import SKIPPED as SKIPPED
from .checks import Finding as Finding
from .surface import ROWS as ROWS
from .surface import child_index as child_index
from .surface import completion_prompt as completion_prompt
