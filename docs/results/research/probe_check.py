"""IG probe tokenization check (docs/results/research/README.md): the gold answer's mean per-token
log-prob after the prompt and after the searches, on 40 of the backbone's SFT search transcripts,
with the template head and gold encoded apart ("split") or the gold with its leading space
("natural"). Usage: python docs/results/research/probe_check.py [runs/research/backbone]"""
import json, torch, numpy as np
from transformers import AutoTokenizer, AutoModelForCausalLM
import sys
root = sys.argv[1] if len(sys.argv) > 1 else 'runs/research/backbone'
t=AutoTokenizer.from_pretrained(root+'/tokenizer'); m=AutoModelForCausalLM.from_pretrained(root+'/sft/hf_export').eval()
enc=lambda s: t.encode(s, add_special_tokens=False)
head="<think>Now there's enough information to answer</think>\n<answer> "; tail=" </answer>"
res={'split_before':[], 'split_after':[], 'nat_before':[], 'nat_after':[]}
rows=[json.loads(l) for l in open(root+'/demos.jsonl')][:400]
rows=[r for r in rows if r.get('kind')=='search' and r['searches']>=1][:40]
def score(ctx_ids, ans_ids, tail_ids):
  ids=ctx_ids+ans_ids
  with torch.no_grad(): lp=torch.log_softmax(m(torch.tensor([ids])).logits[0].float(),-1)
  s=len(ctx_ids); return float(np.mean([lp[s+j-1, ids[s+j]].item() for j in range(len(ans_ids))]))
for r in rows:
  msgs=[{"role":"user","content":r['question']}]
  prompt=t.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
  after=prompt+''.join(s['text'] for s in r['segments'][:-1])
  g=r['golden_answers'][0]
  for name, ctx in (('before',prompt),('after',after)):
    res['split_'+name].append(score(enc(ctx+head), enc(g), []))
    res['nat_'+name].append(score(enc(ctx+head.rstrip(' ')), enc(' '+g), []))
print({k: round(float(np.mean(v)),3) for k,v in res.items()})
print('IG split', round(float(np.mean(np.array(res['split_after'])-res['split_before'])),3), 'nat', round(float(np.mean(np.array(res['nat_after'])-res['nat_before'])),3))
