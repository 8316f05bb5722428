"""Formatters of the `shouter` example adapter (see lmi_server/adapters/formatters.py).

input_formatter(request, context): gets the parsed request (LMI, chat or completion); may change
    it in place. Here: LMI requests without an explicit max_new_tokens get 16.
output_formatter(text, context) -> str: gets generated text (each streamed piece, or the whole
    text); returns what the client sees. Here: upper case.
"""


def input_formatter(request, context):
    if context.schema == "lmi" and "max_new_tokens" not in request.parameters.model_fields_set:
        request.parameters.max_new_tokens = 16
    return None


def output_formatter(text, context):
    return text.upper()
