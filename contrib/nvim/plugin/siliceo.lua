-- :SiliceoStatus, :SiliceoChat {question} (with a range: the lines are the context),
-- :SiliceoSessions, :SiliceoDrop [name], :SiliceoCancel. Configure with require('siliceo').setup({...}).
if vim.g.loaded_siliceo then
  return
end
vim.g.loaded_siliceo = true

vim.api.nvim_create_user_command('SiliceoStatus', function()
  require('siliceo').status()
end, { desc = 'siliceod status' })

vim.api.nvim_create_user_command('SiliceoChat', function(opts)
  local context
  if opts.range > 0 then
    context = table.concat(vim.api.nvim_buf_get_lines(0, opts.line1 - 1, opts.line2, false), '\n')
  end
  require('siliceo').chat(opts.args, context)
end, { nargs = '*', range = true, desc = 'Ask siliceod; with a range, the lines are the context' })

vim.api.nvim_create_user_command('SiliceoSessions', function()
  require('siliceo').list_sessions()
end, { desc = 'List your siliceod sessions' })

vim.api.nvim_create_user_command('SiliceoDrop', function(opts)
  require('siliceo').drop(opts.args)
end, { nargs = '?', desc = 'Drop a siliceod session (default: the configured one)' })

vim.api.nvim_create_user_command('SiliceoCancel', function()
  require('siliceo').cancel()
end, { desc = 'Cancel the reply being streamed' })
