"""Chat templates the conversation tests share."""

# The tiny template with HF's generation markers around each reply (what a reply covers in data.chat: the content and
# its closing EOS and newline): transformers' own assistant mask is the independent reference.
GENERATION_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + eos_token + '\\n' }}"
    "{% endgeneration %}{% else %}{{ message['content'] + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
