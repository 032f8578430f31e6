"""LangChain's with_structured_output (langchain-openai, in .deps/lc, kept
apart from .deps/py because it brings its own openai) against a running
`loom serve`: a pydantic model in, instances out, by the json_schema
method (response_format json_schema). tests/serve_structured.py runs it
in a subprocess.  usage: serve_langchain.py BASE_URL"""
import sys
from typing import Optional

import pydantic
from langchain_openai import ChatOpenAI


class Pet(pydantic.BaseModel):
    kind: str = pydantic.Field(max_length=5)
    legs: int
    owner: Optional[str] = pydantic.Field(max_length=4)


llm = ChatOpenAI(base_url=sys.argv[1], api_key="none", model="run", temperature=1.0, max_tokens=200, max_retries=0)
got = [llm.bind(seed=s).with_structured_output(Pet, method="json_schema").invoke("a pet") for s in range(4)]
print("OK" if all(isinstance(p, Pet) for p in got) else "BAD", got)
