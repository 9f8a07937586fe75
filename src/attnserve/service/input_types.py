"""Which side of a search a text is on: Voyage's and Cohere's input_type, Jina's task.

A query is embedded as a short text always is: the deployment's pooling for queries
(Pooling.for_queries: the mean, or [CLS] under cls pooling) at any length, so that a long
query never takes the document path. A document takes the deployment's document path: its
pooling (opening for long texts) and, for chunks sent as one document, the
contextual chunk vectors (ServiceState.contextual_context). Leaving the field out is the
document path, the behaviour of the routes without it.
"""
from __future__ import annotations

from attnserve.service.errors import ServiceError

# input_type values (Voyage: query, document; Cohere: search_query, search_document) and the
# side each names.
INPUT_TYPES = {"query": "query", "document": "document", "search_query": "query", "search_document": "document"}

# Jina's task values. Jina's models switch a task adapter; this model has none, so a task
# says only which side a text is on (the symmetric tasks take the document path, as all texts
# do without a task).
JINA_TASKS = {
    "retrieval.query": "query",
    "retrieval.passage": "document",
    "code.query": "query",
    "code.passage": "document",
    "text-matching": "document",
    "classification": "document",
    "separation": "document",
}


def is_query(input_type: str | None, task: str | None = None) -> bool:
    """Whether the texts are queries; 422 when input_type and task disagree."""
    sides = {name: table[value] for name, table, value in (("input_type", INPUT_TYPES, input_type), ("task", JINA_TASKS, task))
             if value is not None}
    if len(set(sides.values())) > 1:
        raise ServiceError(422, f"input_type {input_type!r} says {sides['input_type']} but task {task!r} says {sides['task']}: "
                           "send one of them, or two that agree", "validation", "input_type")
    return "query" in sides.values()


QUERY_VECTORS = {"cls": "the [CLS] vector", "lasttoken": "the last token's vector"}


def describe(pooling, contextual_context: str) -> dict[str, str]:
    """What each side does in this deployment (/info's input_types)."""
    query = pooling.for_queries.mode
    return {
        "query": f"{QUERY_VECTORS.get(query, 'the mean of every token')} at any length, as a short text is "
                 "embedded (input_type query or search_query; Jina tasks retrieval.query and code.query)",
        "document": f"pooling {pooling.mode}, as without input_type; chunks sent as one document (late_chunking, "
                    f"/v1/contextualizedembeddings): context {contextual_context} (input_type document, search_document or "
                    "none; every other Jina task)",
    }
