-- siliceo for Neovim: talk to siliceod over its Unix socket (see siliceo-rpc(7)).
--
-- Single request/response (status) uses an rpc channel: sockconnect(..., {rpc = true}) and
-- vim.rpcrequest(). Streamed replies cannot: Neovim dispatches notifications arriving on an rpc
-- channel as calls of its own API and a plugin cannot register a handler for them
-- (neovim/neovim#31868). So chat opens a raw channel (on_data) and frames msgpack-RPC itself
-- with vim.mpack.
local M = {}

M.config = {
  socket = nil,            -- path; default: $SILICEO_SOCKET, else the per-user then the system socket
  think = false,           -- let the model reason before answering
  show_reasoning = false,  -- put the reasoning into the buffer too
  max_tokens = nil,        -- answer budget; nil: the daemon's default
  temperature = nil,
  system = nil,            -- system prompt
  session = nil,           -- keep the conversation in the daemon under this name: each chat
                           -- continues it (the daemon keeps the transcript, see sil-chat -S)
  split = 'vnew',          -- how the reply buffer is opened
}

function M.setup(opts)
  M.config = vim.tbl_extend('force', M.config, opts or {})
end

-- The sockets to try, in order: the configured one or $SILICEO_SOCKET alone; else the per-user
-- socket, then the system service's (root: the system one first), as the other clients do.
local SYSTEM_SOCKET = '/run/siliceo/siliceod.sock'

function M.socket_paths()
  if M.config.socket and M.config.socket ~= '' then
    return { M.config.socket }
  end
  local env = vim.env.SILICEO_SOCKET
  if env and env ~= '' then
    return { env }
  end
  local uid = vim.uv and vim.uv.getuid() or vim.loop.getuid()
  local xdg = vim.env.XDG_RUNTIME_DIR
  local user
  if xdg and xdg ~= '' then
    user = xdg .. '/siliceo/siliceod.sock'
  else
    -- no login session: /run/user/UID when it is ours, else the daemon's /tmp fallback
    local run = string.format('/run/user/%d', uid)
    local st = (vim.uv or vim.loop).fs_stat(run)
    if st and st.type == 'directory' and st.uid == uid then
      user = run .. '/siliceo/siliceod.sock'
    else
      user = string.format('/tmp/siliceo-%d/siliceod.sock', uid)
    end
  end
  if uid == 0 then
    return (xdg and xdg ~= '') and { SYSTEM_SOCKET, user } or { SYSTEM_SOCKET }
  end
  return { user, SYSTEM_SOCKET }
end

function M.socket_path()
  return M.socket_paths()[1]
end

-- Opens a channel on the first socket that answers; else nil and a message naming every path
-- tried with its reason.
local function connect(opts)
  local tried = {}
  for _, path in ipairs(M.socket_paths()) do
    local ok, ch = pcall(vim.fn.sockconnect, 'pipe', path, opts)
    if ok and ch ~= 0 then
      return ch
    end
    local why = ok and 'cannot connect' or tostring(ch):gsub('^.-:%s*', '')
    table.insert(tried, string.format('%s (%s)', path, why))
  end
  local hint = #tried > 1 and '; is siliceod running? set the socket option or SILICEO_SOCKET'
    or ''
  return nil, 'cannot connect to siliceod: tried ' .. table.concat(tried, ', ') .. hint
end
M.connect = connect

local function errmsg(e)
  if type(e) == 'table' then
    return string.format('%s (error %s)', tostring(e.message), tostring(e.code))
  end
  return tostring(e)
end

-- ---- single request over an rpc channel -----------------------------------------------------

function M.request(method, params)
  local ch, cerr = connect({ rpc = true })
  if not ch then
    return nil, cerr
  end
  local ok2, res = pcall(vim.rpcrequest, ch, method, params or vim.empty_dict())
  vim.fn.chanclose(ch)
  if not ok2 then
    return nil, tostring(res)
  end
  return res
end

function M.status()
  local st, err = M.request('status')
  if not st then
    vim.notify('siliceo: ' .. err, vim.log.levels.ERROR)
    return
  end
  local model = type(st.model) == 'table' and st.model.name or 'none'
  local q = type(st.queue) == 'table' and st.queue or {}
  vim.notify(string.format('siliceod %s: %s, model %s (%s), %d running, %d queued, up %ds',
    tostring(st.version), tostring(st.state), tostring(model), tostring(st.backend),
    q.running or 0, q.queued or 0, math.floor(st.uptime_s or 0)))
  return st
end

-- ---- sessions ------------------------------------------------------------------------------

local function my_uid()
  return vim.uv and vim.uv.getuid() or vim.loop.getuid()
end

-- The caller's sessions (sessions.list), or nil and an error.
function M.sessions()
  local res, err = M.request('sessions.list')
  if not res then
    return nil, err
  end
  return res.sessions or {}
end

-- Messages the daemon keeps for session `name` (0 when it is new).
function M.session_messages(name)
  for _, s in ipairs(M.sessions() or {}) do
    if s.name == name and s.uid == my_uid() then
      return s.messages or 0
    end
  end
  return 0
end

function M.list_sessions()
  local list, err = M.sessions()
  if not list then
    vim.notify('siliceo: ' .. err, vim.log.levels.ERROR)
    return
  end
  local lines = {}
  for _, s in ipairs(list) do
    table.insert(lines, string.format('%s: %d messages, %d tokens, %.1f MiB%s', tostring(s.name),
      s.messages or 0, s.n_tokens or 0, (s.memory or 0) / 1048576,
      s.uid ~= my_uid() and (' (uid ' .. tostring(s.uid) .. ')') or ''))
  end
  vim.notify(#lines > 0 and table.concat(lines, '\n') or 'siliceo: no sessions')
  return list
end

function M.drop(name)
  local name_ = (name and name ~= '') and name or M.config.session
  if not name_ then
    vim.notify('siliceo: which session?', vim.log.levels.WARN)
    return false
  end
  local ok, err = M.request('sessions.drop', { name = name_ })
  if not ok then
    vim.notify('siliceo: ' .. err, vim.log.levels.ERROR)
    return false
  end
  return true
end

-- ---- streaming over a raw channel -----------------------------------------------------------

-- chansend() takes a list of lines in which NUL bytes are written as "\n".
local function to_lines(bytes)
  local lines = vim.split(bytes, '\n', { plain = true })
  for i, l in ipairs(lines) do
    lines[i] = l:gsub('%z', '\n')
  end
  return lines
end

-- on_data gives the same representation back: rebuild the bytes.
local function from_lines(data)
  local parts = {}
  for i, l in ipairs(data) do
    parts[i] = l:gsub('\n', '\0')
  end
  return table.concat(parts, '\n')
end

local current -- the stream in progress: {ch, id, buf}

-- True while a reply is being streamed (for a status line, or a script that waits for it).
function M.running()
  return current ~= nil
end

-- 1234567 -> "1,234,567", as sil-chat writes counts.
local function group_digits(n)
  local s = tostring(math.floor(n))
  local k
  repeat
    s, k = s:gsub('^(%d+)(%d%d%d)', '%1,%2')
  until k == 0
  return s
end

-- While the daemon reads a long prompt, the reply buffer's last line shows how far it has got,
-- as virtual text (never part of the answer): "reading the prompt: X / Y tokens (C cached)".
-- It goes when the answer begins or the request ends.
M.progress_ns = vim.api.nvim_create_namespace('siliceo_progress')

local function progress_clear(buf)
  if vim.api.nvim_buf_is_valid(buf) then
    vim.api.nvim_buf_clear_namespace(buf, M.progress_ns, 0, -1)
  end
end

-- A "progress" notification (siliceo-rpc(7)); figures that make no sense are ignored.
local function on_progress(st, p)
  local n_prompt, n_cached, done = p.n_prompt, p.n_cached, p.n_evaluated
  if st.answering or not vim.api.nvim_buf_is_valid(st.buf) or type(n_prompt) ~= 'number'
      or type(n_cached) ~= 'number' or type(done) ~= 'number' or n_prompt <= 0 or n_cached < 0
      or n_cached >= n_prompt or done < 0 or done > n_prompt - n_cached then
    return
  end
  local total = n_prompt - n_cached
  if done == total and not st.progress_shown then
    return -- done at once: nothing to wait for
  end
  local text = string.format('reading the prompt: %s / %s tokens%s', group_digits(done),
    group_digits(total), n_cached > 0 and (' (' .. group_digits(n_cached) .. ' cached)') or '')
  local last = vim.api.nvim_buf_line_count(st.buf) - 1
  progress_clear(st.buf)
  vim.api.nvim_buf_set_extmark(st.buf, M.progress_ns, last, 0,
    { virt_text = { { text, 'Comment' } }, virt_text_pos = 'eol' })
  st.progress_shown = true
end

local function append(buf, text)
  if not vim.api.nvim_buf_is_valid(buf) or text == '' then
    return
  end
  local n = vim.api.nvim_buf_line_count(buf)
  local last = vim.api.nvim_buf_get_lines(buf, n - 1, n, false)[1] or ''
  local lines = vim.split(last .. text, '\n', { plain = true })
  vim.api.nvim_buf_set_lines(buf, n - 1, n, false, lines)
end

local function stream_request(method, params, buf, on_done)
  local unpacker = vim.mpack.Unpacker()
  local id = 1
  local ch
  local st = { buf = buf } -- answering: a piece of the answer came; progress_shown
  local function on_data(_, data)
    if #data == 1 and data[1] == '' then
      vim.schedule(function()
        progress_clear(buf)
      end)
      if current and current.ch == ch then
        current = nil
      end
      return -- EOF
    end
    local bytes = from_lines(data)
    local pos = 1
    while pos <= #bytes do
      local msg
      msg, pos = unpacker(bytes, pos)
      if msg == nil then
        break -- incomplete: the unpacker keeps the partial message
      end
      vim.schedule(function()
        if msg[1] == 2 and msg[2] == 'token' then
          local p = msg[3]
          local islist = vim.islist or vim.tbl_islist
          if type(p) == 'table' and islist(p) then
            p = p[1]
          end
          if type(p) == 'table' and not st.answering then
            st.answering = true
            progress_clear(buf)
          end
          if type(p) == 'table' then
            if M.config.show_reasoning and type(p.reasoning) == 'string' then
              append(buf, p.reasoning)
            end
            if type(p.text) == 'string' then
              append(buf, p.text)
            end
          end
        elseif msg[1] == 2 and msg[2] == 'progress' then
          local p = msg[3]
          if type(p) == 'table' and type(p[1]) == 'table' and p[1].id == id then
            on_progress(st, p[1])
          end
        elseif msg[1] == 1 and msg[2] == id then
          progress_clear(buf)
          if msg[3] ~= nil and msg[3] ~= vim.NIL then
            vim.notify('siliceo: ' .. errmsg(msg[3]), vim.log.levels.ERROR)
          end
          pcall(vim.fn.chanclose, ch)
          if current and current.ch == ch then
            current = nil
          end
          if on_done then
            on_done(msg[4])
          end
        end
      end)
    end
  end
  local c, cerr = connect({ on_data = on_data })
  if not c then
    vim.notify('siliceo: ' .. cerr, vim.log.levels.ERROR)
    return
  end
  ch = c
  current = { ch = ch, id = id, next_id = id + 1, buf = buf }
  vim.fn.chansend(ch, to_lines(vim.mpack.encode({ 0, id, method, params })))
end

function M.cancel()
  if not current then
    return
  end
  local cid = current.next_id
  current.next_id = cid + 1
  vim.fn.chansend(current.ch, to_lines(vim.mpack.encode({ 0, cid, 'cancel', { id = current.id } })))
end

-- Asks `question` (and `context`, e.g. the selected lines) and streams the reply into a new
-- scratch buffer.
function M.chat(question, context)
  local content = question or ''
  if context and context ~= '' then
    content = context .. '\n\n' .. content
  end
  if content == '' then
    vim.notify('siliceo: nothing to ask', vim.log.levels.WARN)
    return
  end
  local messages = {}
  local session = M.config.session
  -- With a session the daemon keeps the transcript: send only the new message (the system
  -- prompt when the conversation starts).
  if M.config.system and not (session and M.session_messages(session) > 0) then
    table.insert(messages, { role = 'system', content = M.config.system })
  end
  table.insert(messages, { role = 'user', content = content })
  local params = { messages = messages, think = M.config.think, progress = true }
  params.max_tokens = M.config.max_tokens
  params.temperature = M.config.temperature
  params.session = session
  if session then
    params.append = true
  end

  vim.cmd(M.config.split)
  local buf = vim.api.nvim_get_current_buf()
  vim.bo[buf].buftype = 'nofile'
  vim.bo[buf].bufhidden = 'wipe'
  vim.bo[buf].filetype = 'markdown'
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, { '' })
  stream_request('chat', params, buf, function(res)
    if type(res) ~= 'table' then
      return
    end
    -- the daemon left out the conversation's oldest turns to fit its context (sil-chat says so too)
    local dropped = res.dropped_messages
    if type(dropped) == 'number' and dropped > 0 then
      vim.notify(string.format('siliceo: the conversation no longer fitted the daemon\'s context: '
        .. 'its %d oldest messages were dropped (the system prompt stays)', dropped),
        vim.log.levels.WARN)
    end
    if res.stop_reason and res.stop_reason ~= 'eos' then
      append(buf, '\n[' .. tostring(res.stop_reason) .. ']')
    end
  end)
end

return M
