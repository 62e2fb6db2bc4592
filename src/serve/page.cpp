// The chat page served at "/": plain HTML and JavaScript, no framework. It keeps the
// conversation in the page and sends it whole each turn (the server continues the session's
// cache when the messages extend it), streams the reply, and shows per session a gauge: the
// session's K/V payload bytes (kv_payload_bytes) as a share of what the full fp16 cache would
// hold for the same tokens (kv_full_bytes; the full cache itself reads 100%), and on a separate
// line the overhead, resident minus payload (positions, per-row scores and bookkeeping, spare
// container capacity). An "API key" field (kept in sessionStorage only) is sent as
// "Authorization: Bearer KEY" on every request; a 401 asks for the key.
// URL parameters: ?prompt=TEXT sends TEXT at load; max_tokens=N, method=SPEC, seed=N,
// temperature=T set the request's fields. When a reply ends (or fails) the body gets
// data-done="N" (N replies so far), for tests.
#include "serve/server.h"

namespace vq::serve {

const char* chat_page_html() noexcept {
  return R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>VeloxQuant chat</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:system-ui,sans-serif;max-width:46rem;margin:1.5rem auto;padding:0 1rem;color:#222}
h1{font-size:1.2rem}#log{border:1px solid #ccc;border-radius:6px;padding:.6rem;min-height:12rem}
.msg{margin:.4rem 0;white-space:pre-wrap}.user{color:#05a}.assistant{color:#222}
.role{font-weight:600;margin-right:.4rem}form{display:flex;gap:.5rem;margin-top:.6rem}
#text{flex:1;padding:.4rem}.gauge{margin:.5rem 0;font-size:.85rem}
.bar{height:.7rem;background:#eee;border-radius:4px;overflow:hidden;margin-top:.2rem}
.fill{height:100%;background:#3a7}#err{color:#b00}.over{color:#666}
#keyrow{margin:.4rem 0;font-size:.85rem}#key{padding:.2rem}
</style></head><body>
<h1>VeloxQuant chat</h1>
<div id="keyrow"><label for="key">API key</label> <input id="key" type="password"
autocomplete="off" size="28" placeholder="only if the server has --api-key"></div>
<div id="log"></div>
<div id="err"></div>
<form id="f"><input id="text" autocomplete="off" placeholder="Say something">
<input id="method" size="16" placeholder="method (server default)"><button>Send</button></form>
<div id="gauges"></div>
<script>
const q=new URLSearchParams(location.search);const messages=[];let replies=0;
const log=document.getElementById('log'),err=document.getElementById('err');
if(q.get('method'))document.getElementById('method').value=q.get('method');
const key=document.getElementById('key');
try{key.value=sessionStorage.getItem('vq_api_key')||'';}catch(e){}
key.addEventListener('input',()=>{try{sessionStorage.setItem('vq_api_key',key.value);}catch(e){}});
function headers(){const h={'Content-Type':'application/json'};const k=key.value.trim();
if(k)h['Authorization']='Bearer '+k;return h;}
function add(role,text){const d=document.createElement('div');d.className='msg '+role;
const r=document.createElement('span');r.className='role';r.textContent=role+':';
const t=document.createElement('span');t.className='text';t.textContent=text;d.append(r,t);
log.append(d);return t;}
function fmt(b){return b>=1048576?(b/1048576).toFixed(2)+' MB':(b/1024).toFixed(1)+' KB';}
function gauge(v){if(!v||!v.session)return;let g=document.getElementById('g-'+v.session);
if(!g){g=document.createElement('div');g.className='gauge';g.id='g-'+v.session;
g.innerHTML='<span class="label"></span><div class="bar"><div class="fill"></div></div>'+
'<span class="over"></span>';document.getElementById('gauges').append(g);}
const pay=v.kv_payload_bytes,full=v.kv_full_bytes,over=Math.max(0,v.kv_bytes-pay);
const pct=full>0?100*pay/full:0;
g.dataset.kvBytes=v.kv_bytes;g.dataset.kvPayloadBytes=pay;g.dataset.kvFullBytes=full;
g.dataset.pct=pct.toFixed(1);g.dataset.overheadBytes=over;
g.querySelector('.label').textContent='session '+v.session+': K/V '+fmt(pay)+' of '+
fmt(full)+' for the full fp16 cache of the same tokens ('+pct.toFixed(0)+'%)';
g.querySelector('.over').textContent='overhead: '+fmt(over)+' (positions, scores, '+
'bookkeeping, spare capacity); resident in all '+fmt(v.kv_bytes);
g.querySelector('.fill').style.width=Math.min(100,pct)+'%';}
async function send(text){messages.push({role:'user',content:text});add('user',text);
err.textContent='';
const out=add('assistant','');const body={messages:messages.slice(),stream:true};
for(const k of ['max_tokens','seed'])if(q.get(k))body[k]=parseInt(q.get(k));
if(q.get('temperature'))body.temperature=parseFloat(q.get('temperature'));
const m=document.getElementById('method').value.trim();if(m)body.veloxquant={method:m};
let reply='',ok=false;try{const r=await fetch('/v1/chat/completions',{method:'POST',
headers:headers(),body:JSON.stringify(body)});
if(r.status===401)throw new Error(key.value.trim()?'the server refused the API key: '+
'check it in the API key field and send again':'this server requires an API key: '+
'enter it in the API key field and send again');
if(!r.ok){let m=r.statusText;try{const e=await r.json();if(e.error)m=e.error.message;}catch(x){}
throw new Error(m);}
const rd=r.body.getReader(),dec=new TextDecoder();let buf='';
for(;;){const {value,done}=await rd.read();if(done)break;buf+=dec.decode(value,{stream:true});
let i;while((i=buf.indexOf('\n\n'))>=0){const ev=buf.slice(0,i);buf=buf.slice(i+2);
if(!ev.startsWith('data: '))continue;const data=ev.slice(6);if(data==='[DONE]')continue;
const j=JSON.parse(data);if(j.error)throw new Error(j.error.message);
const c=j.choices[0];if(c.delta&&c.delta.content){reply+=c.delta.content;out.textContent=reply;}
gauge(j.veloxquant);}}ok=true;}catch(e){err.textContent='error: '+e.message;}
if(ok||reply)messages.push({role:'assistant',content:reply});else messages.pop();
replies++;document.body.dataset.done=replies;}
document.getElementById('f').addEventListener('submit',e=>{e.preventDefault();
const t=document.getElementById('text');if(t.value.trim()){send(t.value);t.value='';}});
if(q.get('prompt'))send(q.get('prompt'));
</script></body></html>
)HTML";
}

}  // namespace vq::serve
