"""How a head or a monitor is kept: the saved format (``config.json`` + safetensors, checked on
load, never unpickled), sharing on the Hugging Face Hub, and the model cards written beside them.

Below the head: it imports no other folder of the package (the cards read the objects they are
given by attribute) and no interpretability toolkit.
"""

from ._cards import head_card as head_card
from ._cards import monitor_card as monitor_card
from ._cards import training_section as training_section
from ._format import CONFIG_FILE as CONFIG_FILE
from ._format import READS_ANSWER_VERSION as READS_ANSWER_VERSION
from ._format import WEIGHTS_FILE as WEIGHTS_FILE
from ._format import check_tensors as check_tensors
from ._format import dir_files as dir_files
from ._format import files_of as files_of
from ._format import read_dir as read_dir
from ._format import read_files as read_files
from ._format import require as require
from ._format import write_dir as write_dir
from ._hub import HubMixin as HubMixin
from ._hub import is_repo_id as is_repo_id
