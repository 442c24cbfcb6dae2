"""The rules tests/test_docs.py runs the docs' blocks by (tests/docs_blocks.py), on Markdown of its own."""
from __future__ import annotations

from .docs_blocks import parse, unanswered

PAGE = """# A page

```bash
curl -s localhost:8080/v2/models/linear/infer -d '{}'   # a comment, not an answer
# {"model_name":"linear","outputs":[{"name":"y",
#   "data":[4.5,4.5]}]}
pip install 'tritonclient[http,grpc]>=2.50' numpy
```

<!-- docs-test: not run: needs a Kubernetes cluster of yours -->
```bash
kubectl get isvc
```

<!-- an ordinary comment -->

```python
print(client.infer())   # [[ 4.5  4.5] [10.5 10.5]]
print(client.ping())    # the server's health, as a dict
print(ready)            # True
```

```json
{"not": "a command"}
```

```yaml
kind: Pod
```
"""


def test_bash_and_python_blocks_are_found_with_their_line_and_excuse() -> None:
    blocks = parse("page.md", PAGE)
    assert [(b.line, b.language, b.excuse) for b in blocks] == [
        (3, "bash", None), (11, "bash", "needs a Kubernetes cluster of yours"), (17, "python", None)]


def test_an_excuse_counts_only_on_the_line_before_the_fence() -> None:
    page = "<!-- docs-test: not run: far away from it -->\n\nsome prose\n\n```bash\nls\n```\n"
    (block,) = parse("page.md", page)
    assert block.excuse is None  # prose between: the block is run


def test_answers_are_the_json_comments_in_bash_and_the_printed_ones_in_python() -> None:
    bash, _, python = parse("page.md", PAGE)
    assert bash.answers() == ['{"model_name":"linear","outputs":[{"name":"y","data":[4.5,4.5]}]}']
    assert python.answers() == ["[[ 4.5  4.5] [10.5 10.5]]", "True"]


def test_pip_install_lines_are_checked_not_run() -> None:
    bash = parse("page.md", PAGE)[0]
    assert bash.pip_installs() == ["tritonclient", "numpy"]
    assert "\npip install" not in bash.script({8080: 8080})


def test_the_docs_ports_are_rewritten_and_no_other_number() -> None:
    (block,) = parse("page.md", "```bash\ncurl localhost:8080/a:18080 --grpc 8081 -d 80800\n```\n")
    assert block.script({8080: 40001, 8081: 40002}) == "curl localhost:40001/a:18080 --grpc 40002 -d 80800\n"


def test_an_answer_matches_with_its_elisions_and_whitespace_and_in_order() -> None:
    out = '{"model_name": "linear", "outputs": [{"name": "y", "data": [4.5, 4.5]}]}\n{"predictions":[[2.0]]}\n'
    assert unanswered(['{"model_name":"linear",...,"data":[4.5,4.5]}]}', '{"predictions":[[2.0]]}'], out) == []
    assert unanswered(['{"predictions":[[2.0]]}', '{"model_name":"linear"...}'], out) == ['{"model_name":"linear"...}']
    assert unanswered(['{"model_name":"linear",...,"data":[4.5,4.6]}]}'], out) != []  # a wrong value is one


def test_a_server_the_block_starts_gets_the_default_ports_it_does_not_name_rewritten() -> None:
    text = "```bash\novserve serve --model-repository m --rest-port 8080 &\novserve serve --a \\\n  --b x\n```\n"
    (block,) = parse("page.md", text)
    assert block.script({8080: 1, 8081: 2}) == (
        "ovserve serve --grpc-port 2 --model-repository m --rest-port 1 &\n"
        "ovserve serve --rest-port 1 --grpc-port 2 --a \\\n  --b x\n")
